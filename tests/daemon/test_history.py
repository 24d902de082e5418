"""Issue 35, item 5, through the daemon: a lender waiting for its borrower's minimum runtime
is told the planned reclaim and when; its history keeps each distinct wait reason (not one
per refresh) and the preemption it caused."""

from __future__ import annotations

from collections.abc import Callable

from rest_framework.test import APIClient

from scheduler.daemon.history import WAIT_EVENTS_PER_JOB, reason_shape, write_wait_events
from scheduler.models import Job, JobEvent
from tests.daemon.conftest import Env

RUN = {"duration_s": 100_000}


def lender_waits(env: Env):
    """team-bravo (guaranteed 16) fills the 4 x 8 GPUs, borrowing 16 of team-alpha's
    guarantee, and queues one more job (at its limit, 32); alice (team-alpha, guaranteed 16)
    then asks for 8. Default profile: a minimum runtime of 300 s."""
    daemon = env.daemon()
    borrowed = [env.submit("bob-bravo", resources={"gpus": 8}, simulation=RUN) for _ in range(4)]
    env.run(daemon, seconds=2, cycles=3)
    later = env.submit("bob-bravo", resources={"gpus": 8}, simulation=RUN)
    lender = env.submit("alice", resources={"gpus": 8}, simulation=RUN)
    env.run(daemon, seconds=2, cycles=2)
    return daemon, borrowed, later, lender


def waits(job: Job) -> list[JobEvent]:
    return list(JobEvent.objects.filter(job=job, kind="waiting").order_by("id"))


def test_the_lender_is_told_the_planned_reclaim_and_its_history_keeps_it_once(env: Env) -> None:
    daemon, _, _, lender = lender_waits(env)
    lender.refresh_from_db()
    assert lender.state == "queued"
    assert (
        "team-alpha reclaims its guarantee from team-bravo (8 H100-80GB lent): preemption "
        "planned in about 5 min, when its job leaves its minimum runtime" in lender.reason
    ), lender.reason
    [told] = waits(lender)
    assert told.message == lender.reason
    assert told.data["code"] == "capacity"
    assert {k: told.data["plan"][k] for k in ("cause", "victims", "gpus", "flavor")} == {
        "cause": "reclaim",
        "victims": 1,
        "gpus": 8.0,
        "flavor": "H100-80GB",
    }
    # A minute of refreshes: the countdown moves ("about 5 min", "about 4 min"), the
    # reason's shape does not: still one event.
    env.run(daemon, seconds=6, cycles=10)
    lender.refresh_from_db()
    assert "planned in about 4 min" in lender.reason
    assert len(waits(lender)) == 1


def test_the_preemption_a_job_caused_is_in_its_history(env: Env) -> None:
    daemon, borrowed, _, lender = lender_waits(env)
    env.run(daemon, seconds=30, cycles=12)  # past the borrowers' minimum runtime
    env.run(daemon, seconds=2, cycles=6)  # the victim's pods go, the lender starts
    lender.refresh_from_db()
    assert lender.state == "running"
    [caused] = JobEvent.objects.filter(job=lender, kind="preempting")
    [victim] = [j for j in borrowed if JobEvent.objects.filter(job=j, kind="preempted").exists()]
    assert caused.message.startswith(
        f"Preempted job {victim.pk}: team-alpha reclaims its guarantee from team-bravo, "
        "which borrows (8 GPUs, "
    ), caused.message
    assert {k: caused.data[k] for k in ("cause", "victims", "gpus")} == {
        "cause": "reclaim",
        "victims": 1,
        "gpus": 8.0,
    }
    # Two distinct wait reasons: the planned reclaim, then the wait for the victim to stop.
    shapes = [e.message for e in waits(lender)]
    assert len(shapes) == 2 and shapes[1].startswith(f"preempting job(s) {victim.pk}"), shapes


def test_other_teams_are_hidden_from_a_member_in_the_api_events(
    env: Env, clients: Callable[[str], APIClient]
) -> None:
    daemon, _, _, lender = lender_waits(env)
    env.run(daemon, seconds=30, cycles=12)
    env.run(daemon, seconds=2, cycles=4)
    url = f"/api/v1/jobs/{lender.pk}/events/"
    mine = clients("alice").get(url).json()["results"]
    texts = [e["message"] for e in mine if e["kind"] in ("waiting", "preempting")]
    assert len(texts) >= 2 and not any("team-bravo" in t for t in texts), texts
    assert any(
        "reclaims its guarantee from another team (8 H100-80GB lent): preemption planned" in t
        for t in texts
    ), texts
    assert any(t.startswith("Preempted a job of another team: team-alpha reclaims") for t in texts)
    planned = next(e for e in mine if e["kind"] == "waiting")
    assert planned["data"]["plan"]["cause"] == "reclaim"
    admin = clients("pat").get(url).json()["results"]
    assert any("from team-bravo" in e["message"] for e in admin if e["kind"] == "preempting")


def test_reason_shape_ignores_figures_only() -> None:
    assert reason_shape("uses 14/16 H100; planned in 40 s") == reason_shape(
        "uses 15/16 H100; planned in 9 s"
    )
    assert reason_shape("planned in about 5 min, when") == reason_shape("planned in 82 s, when")
    assert reason_shape("reclaims from team-b") != reason_shape("reclaims from team-c")


def test_a_flapping_reason_stops_adding_events(env: Env) -> None:
    job = env.submit("alice")
    for i in range(WAIT_EVENTS_PER_JOB + 5):
        write_wait_events({job.pk: (f"reason {'ab'[i % 2]}", {})})
    assert len(waits(job)) == WAIT_EVENTS_PER_JOB
