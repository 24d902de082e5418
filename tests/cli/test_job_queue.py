"""`gantry job ID` on a waiting job: its position, the jobs ahead and its start range."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from cli import when
from scheduler.api import queue as api_queue
from tests.conftest import Org
from tests.eta_builders import small_queue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gantry_as_alice(gantry: Any) -> Any:
    return lambda *argv: gantry("alice", *argv)


def test_job_shows_position_ahead_and_start(gantry_as_alice: Any, org: Org) -> None:
    queue = small_queue(org, timezone.now())
    code, out, err = gantry_as_alice("job", str(queue.second.pk))
    assert code == 0, err
    lines = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
    assert lines["position"] == "2 in team, 3 in cluster"
    assert lines["ahead"] == f"2 job(s): #{queue.first.pk}; 1 of other teams"
    assert lines["starts"].count("..") == 1
    assert f"#{queue.bravo.pk}" not in out and "bravo" not in out


def test_job_json_carries_the_queue(gantry_as_alice: Any, org: Org) -> None:
    queue = small_queue(org, timezone.now())
    code, out, _ = gantry_as_alice("--json", "job", str(queue.second.pk))
    body = json.loads(out)
    assert code == 0
    assert body["queue"]["position_cluster"] == 3 and body["queue"]["ahead_hidden"] == 1
    assert "bravo" not in out


def test_job_says_when_it_starts_in_words_from_the_servers_clock(
    gantry_as_alice: Any, org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate was made at `made`; the server answers 15 minutes later (its clock,
    injected), so the p50 40 minutes after `made` is 25 minutes away, the p90 (90) 75."""
    made = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    queue = small_queue(org, made)
    monkeypatch.setattr(api_queue, "server_now", lambda: made + timedelta(minutes=15))
    code, out, err = gantry_as_alice("job", str(queue.second.pk))
    assert code == 0, err
    lines = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}
    assert lines["starts_in"] == "in about 25 min (p90 1 h 15 min)"
    assert lines["starts"].startswith("2026-12-04T09:40:00")


def queue_answer(now: str, p50: str | None, p90: str | None) -> dict[str, Any]:
    return {"now": now, "eta_p50": p50, "eta_p90": p90, "estimated_at": now}


NOW = "2026-12-04T09:00:00Z"


@pytest.mark.parametrize(
    ("p50", "p90", "words"),
    [
        ("2026-12-04T09:00:30Z", "2026-12-04T09:10:00Z", "any moment now (p90 10 min)"),
        ("2026-12-04T09:25:00Z", "2026-12-04T10:10:00Z", "in about 25 min (p90 1 h 10 min)"),
        ("2026-12-04T11:00:20Z", None, "in about 2 h (p90 later)"),
        ("2026-12-06T13:00:00Z", "2026-12-07T09:00:00Z", "in about 2 d 4 h (p90 3 d)"),
        # An estimate already past (the scheduler has not placed it yet): due now.
        ("2026-12-04T08:50:00Z", "2026-12-04T08:55:00Z", "any moment now (p90 0 min)"),
    ],
    ids=["due", "minutes", "hours-no-p90", "days", "past"],
)
def test_starts_in_words(p50: str, p90: str | None, words: str) -> None:
    assert when.starts_in(queue_answer(NOW, p50, p90)) == words


def test_no_words_without_an_estimate() -> None:
    assert when.starts_in({**queue_answer(NOW, None, None), "estimated_at": None}) == ""
    assert when.starts_in(queue_answer(NOW, None, None)) == ""


def test_a_waiting_job_without_a_position_shows_its_note() -> None:
    # the API's answer for a job requeued since the scheduler's last pass
    from cli.main import queue_lines

    note = "Queued; the scheduler places it in its order at its next pass (every 30 s)."
    unplaced = ["position_cluster", "position_tenant", "ahead_count", "ahead_visible"]
    unplaced += ["ahead_hidden", "eta_p50", "eta_p90", "estimated_at"]
    answer = {"waiting": True, "ahead": [], "position_note": note, **dict.fromkeys(unplaced)}
    assert queue_lines(answer) == {
        "position": note,
        "ahead": "-",
        "starts": "not estimated yet",
        "starts_in": "",
    }
