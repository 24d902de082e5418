"""`gantry job ID` on a waiting job: its position, the jobs ahead and its start range."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from cli.main import main
from tests.conftest import Org
from tests.eta_builders import small_queue

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def gantry_as_alice(live_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, org: Org):
    monkeypatch.setenv("GANTRY_CONFIG", str(tmp_path / "config.json"))
    monkeypatch.setenv("GANTRY_URL", live_server.url)
    monkeypatch.setenv("GANTRY_PASSWORD", "correct-horse-battery")
    monkeypatch.delenv("GANTRY_TOKEN", raising=False)

    def run(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        code = main(list(argv), out=out, err=err)
        return code, out.getvalue(), err.getvalue()

    assert run("login", "alice")[0] == 0
    return run


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
