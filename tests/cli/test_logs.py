"""`gantry logs` and the pods of `gantry job`, against a live server on the simulated
cluster's logs; following takes no wall-clock time (the CLI's sleep is replaced)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from cli import logs as cli_logs
from scheduler.models import Allocation, Job, JobState
from tests import factories as f
from tests.conftest import Org
from tests.pod_builders import requeued_job

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def logs_cli(gantry: Any) -> Any:
    """logs_cli(*argv) -> (exit code, stdout), as alice."""
    return lambda *argv: gantry("alice", *argv)[:2]


def test_logs_prints_the_last_lines_of_a_replica(logs_cli: Any, org: Org) -> None:
    setup = requeued_job(org, timezone.now())
    code, out = logs_cli("logs", str(setup.job.pk), "--replica", "1", "--tail", "4")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 4 and all("[rank1]" in line for line in lines)


def test_logs_of_an_earlier_attempt_end_with_its_checkpoint(logs_cli: Any, org: Org) -> None:
    setup = requeued_job(org, timezone.now())
    code, out = logs_cli("logs", str(setup.job.pk), "--attempt", "0", "--tail", "2")
    assert code == 0
    assert out.splitlines()[-1] == "Checkpoint saved; exiting"


def test_follow_polls_from_the_cursor_until_the_job_ends(
    logs_cli: Any, org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = requeued_job(org, timezone.now())
    naps: list[float] = []

    def nap(seconds: float) -> None:
        """While the CLI waits, the job finishes: its pods end and it succeeds."""
        naps.append(seconds)
        Allocation.objects.filter(job=setup.job, attempt=1).update(ended_at=timezone.now())
        Job.objects.filter(pk=setup.job.pk).update(state=JobState.SUCCEEDED)

    monkeypatch.setattr(cli_logs, "sleep", nap)
    code, out = logs_cli("logs", str(setup.job.pk), "--follow", "--tail", "3")
    assert code == 0
    lines = out.splitlines()
    assert lines[-1] == "exit code 0"
    assert len(lines) == len(set(lines)), "a line was printed twice"
    assert naps == [cli_logs.POLL_S]


def test_ctrl_c_while_following_exits_0(
    logs_cli: Any, org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = requeued_job(org, timezone.now())

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_logs, "sleep", interrupted)
    code, out = logs_cli("logs", str(setup.job.pk), "--follow", "--tail", "2")
    assert code == 0
    assert len(out.splitlines()) == 2


def test_logs_of_another_teams_job_is_not_found(logs_cli: Any, org: Org) -> None:
    job = f.JobFactory(project=org.proj_bravo, submitted_by=org.users["bob-bravo"])
    assert logs_cli("logs", str(job.pk))[0] == logs_cli("job", str(job.pk))[0] == 1


def test_job_shows_its_pods_and_json_carries_them(logs_cli: Any, org: Org) -> None:
    setup = requeued_job(org, timezone.now())
    code, out = logs_cli("job", str(setup.job.pk))
    assert code == 0
    pods = out.split("\npods:\n", 1)[1].splitlines()
    assert pods[0].split() == ["ATTEMPT", "REPLICA", "NODE", "DEVICES", "BOUND_AT", "ENDED_AT",
                               "END_REASON"]  # fmt: skip
    # the device's index on its node, never read as a count of GPUs
    assert pods[1].split()[:6] == ["1", "0", "node-b", "#0", "x0.5", "(H100-80GB)"]
    assert "running" in pods[1] and "attempt ended" in pods[3]
    code, out = logs_cli("--json", "job", str(setup.job.pk))
    body = json.loads(out)
    assert [(p["attempt"], p["node"]) for p in body["pods"]] == [
        (1, "node-b"),
        (1, "node-b"),
        (0, "node-a"),
        (0, "node-a"),
    ]
