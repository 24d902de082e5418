"""The daemon says how its cycles go, and /healthz (and the platform admins' home page) shows
it: a daemon failing every cycle must not look healthy (issue 17, point 1)."""

from __future__ import annotations

from typing import Any

from django.test import Client
from django.utils import timezone

import scheduler.daemon.loop as daemon_module
from scheduler.backends.base import BackendError
from scheduler.daemon.phases import FAILURES_KEPT_S
from scheduler.jobs.selectors import queue_depth
from scheduler.models import Job, JobState, SchedulerLease
from tests.daemon.conftest import Env


def healthz(user: Any = None) -> dict[str, Any]:
    client = Client()
    if user is not None:
        client.force_login(user)
    response = client.get("/healthz")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_healthz_says_ok_while_cycles_complete(env: Env) -> None:
    assert healthz()["scheduler"] == "not running"
    env.run(env.daemon())
    body = healthz()
    assert (body["status"], body["scheduler"]) == ("ok", "ok")


class StopAfter:
    """The loop's waiter: stops the daemon after `waits` waits (no time passes)."""

    def __init__(self, daemon: Any, waits: int) -> None:
        self.daemon, self.waits = daemon, waits

    def wait(self, timeout: float) -> str:
        self.waits -= 1
        if self.waits <= 0:
            self.daemon.stop.set()
        return "timeout"

    def close(self) -> None:
        pass


def test_healthz_says_failing_when_every_cycle_fails(tenv: Env, monkeypatch: Any) -> None:
    # (tenv: after an unexpected error the loop closes its connection and opens another)
    env = tenv
    daemon = env.daemon()
    env.run(daemon)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("can't compare offset-naive and offset-aware datetimes")

    monkeypatch.setattr(daemon_module, "build_snapshot", broken)
    daemon._loop(StopAfter(daemon, 3))  # the loop catches each, reports it, goes on
    body = healthz()
    assert (body["status"], body["scheduler"]) == ("degraded", "failing")
    assert "scheduler_detail" not in body  # no error text for anonymous callers
    detail = healthz(env.org.users["pat"])["scheduler_detail"]
    assert detail["failures"] == 3 and "offset-naive" in detail["error"]
    assert detail["epoch"] == SchedulerLease.objects.get().epoch >= 1
    assert "scheduler_detail" not in healthz(env.org.users["alice"])
    # completed cycles clear it once a minute has passed without a failure
    monkeypatch.undo()
    daemon.stop.clear()
    env.run(daemon, seconds=1)
    assert healthz()["scheduler"] == "failing"
    env.run(daemon, seconds=FAILURES_KEPT_S)
    assert healthz()["scheduler"] == "ok"


def test_backend_failures_are_reported_by_the_step_itself(env: Env) -> None:
    daemon = env.daemon()
    env.run(daemon)
    env.backend.inject("list_pods", BackendError("503 Service Unavailable"), times=100)
    env.run(daemon, seconds=1, cycles=3)
    assert healthz()["scheduler"] == "failing"
    assert "503" in healthz(env.org.users["pat"])["scheduler_detail"]["error"]


def test_healthz_is_stale_when_no_cycle_completed_lately(env: Env, settings: Any) -> None:
    env.run(env.daemon())
    settings.GANTRY_SCHEDULER_STALE_AFTER_S = 0
    assert healthz()["scheduler"] == "stale"


def test_healthz_hides_error_texts_from_anonymous_callers(db: Any, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    body = healthz()
    assert body["broker"] == "unreachable" and "broker_error" not in body
    assert "127.0.0.1" not in str(body) and "Connection" not in str(body)


def test_platform_admins_see_a_failing_scheduler_on_their_home_page(env: Env) -> None:
    daemon = env.daemon()
    env.run(daemon)
    env.backend.inject("list_pods", BackendError("503 Service Unavailable"), times=100)
    env.run(daemon, seconds=1, cycles=3)
    admin = Client()
    admin.force_login(env.org.users["pat"])
    page = admin.get("/").content.decode()
    assert "Scheduler failing" in page and "503 Service Unavailable" in page
    member = Client()
    member.force_login(env.org.users["alice"])
    assert "Scheduler failing" not in member.get("/").content.decode()


def home_scheduler_section(user: Any) -> str:
    admin = Client()
    admin.force_login(user)
    page = admin.get("/").content.decode()
    assert 'id="home-scheduler"' in page
    return page.split('id="home-scheduler"')[1].split("</section>")[0]


def test_platform_admins_see_leader_epoch_and_last_cycle_on_a_healthy_scheduler(env: Env) -> None:
    """Issue 20: the health shows even when all is well, with the leader's epoch."""
    daemon = env.daemon(holder="sched-a")
    env.run(daemon)
    epoch = SchedulerLease.objects.get().epoch
    assert epoch >= 1
    section = home_scheduler_section(env.org.users["pat"])
    assert "Scheduler ok" in section and "sched-a" in section
    assert f'id="home-scheduler-epoch">{epoch}<' in section
    assert "completed" in section and 'id="home-scheduler-failures">0 recently' in section


def test_platform_admins_see_the_queue_depth_by_status(env: Env) -> None:
    waiting = [env.submit(name=f"wait-{n}") for n in range(3)]
    Job.objects.filter(pk=waiting[0].pk).update(reason="quota: team-alpha uses 16/16 H100")
    Job.objects.filter(pk=waiting[1].pk).update(state=JobState.PENDING_APPROVAL)
    # the third stays queued, not tried yet
    depth = queue_depth(timezone.now())
    assert (depth.queued, depth.active, depth.inadmissible, depth.pending_approval) == (2, 1, 1, 1)
    section = home_scheduler_section(env.org.users["pat"])
    stats = section.split('id="home-queue-depth"')[1]
    for number, label in [(2, "queued"), (1, "not tried yet"), (1, "waiting with a reason"),
                          (1, "waiting for approval")]:  # fmt: skip
        assert f"<b>{number}</b><span>{label}</span>" in stats, (number, label)


def test_healthz_says_failing_when_cycles_fail_between_completed_ones(
    tenv: Env, monkeypatch: Any
) -> None:
    """Issue 34, item 23: a demo load whose submission was refused failed every cycle it
    ran in, with completed cycles between; each completed one cleared the count, so eight
    failed cycles left /healthz at "ok"."""
    env = tenv
    calls = {"n": 0}

    def refused_every_other_cycle(_daemon: Any) -> None:
        calls["n"] += 1
        if calls["n"] % 2:
            raise ValueError("demo load: user cap 0")

    daemon = env.daemon(on_cycle=refused_every_other_cycle)
    daemon._loop(StopAfter(daemon, 6))  # fail, complete, fail, complete, fail, complete
    assert calls["n"] == 6
    body = healthz()
    assert (body["status"], body["scheduler"]) == ("degraded", "failing")
    assert healthz(env.org.users["pat"])["scheduler_detail"]["failures"] == 3
    # a minute of completed cycles clears it
    daemon.on_cycle = None
    env.run(daemon, seconds=FAILURES_KEPT_S, cycles=2)
    assert healthz()["scheduler"] == "ok"
