"""The workload controller reads from watches (issue 37): a pass costs no call to the API
server while nothing changes, a change arrives by its watch, and what a broken watch missed
is caught by the periodic relist. Over the fake API server, on a fake clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from scheduler.backends.kubernetes.held import HeldCache
from scheduler.daemon import strays
from scheduler.daemon.loop import Daemon
from scheduler.leader import Lease
from scheduler.management.commands.run_workload_controller import Command
from scheduler.models import Job
from scheduler.workloads.controller import WorkloadController
from scheduler.workloads.watched import WatchedHeld
from tests.conftest import build_org
from tests.k8s.conftest import started_fake
from tests.workloads.test_controller import World, create_job, job, mirrored, pod

PODS, JOBS = "/api/v1/pods", "/apis/batch/v1/jobs"


@pytest.fixture
def world(db: Any) -> Iterator[World]:
    fake = started_fake("k8s-gpu-1", "k8s-gpu-2")
    made = World(build_org(), fake)
    made.watched = WatchedHeld(made.backend, clock=made.clock, relist_s=60.0)  # type: ignore[attr-defined]
    made.controller = WorkloadController(made.watched)  # type: ignore[attr-defined]
    yield made
    made.watched.close()  # type: ignore[attr-defined]
    made.api.close()
    fake.stop()


def reads(world: World, path: str) -> int:
    """The GET requests the API server had for `path` (a list, or a watch opened)."""
    return sum(1 for method, p in world.fake.requests if method == "GET" and p == path)


def watching(world: World, resource: str, streams: int = 1) -> None:
    """Wait until `streams` watches of `resource` are open past their backlog."""
    with world.fake.cond:
        assert world.fake.cond.wait_for(
            lambda: world.fake.streaming.get(resource, 0) >= streams, timeout=10
        )


def arrived(world: World, *names: str, gone: bool = False) -> None:
    """Wait until the watches have told the controller's caches of `names` (their
    creation, or with `gone` their deletion): each change they see sets `changed`."""
    watched: WatchedHeld = world.watched  # type: ignore[attr-defined]

    def cached() -> set[str]:
        kinds = [watched.cache("", "v1", "pods"), watched.cache("batch", "v1", "jobs")]
        return {o["metadata"]["name"] for c in kinds for o in c.items()}

    while (set(names) & cached()) != (set() if gone else set(names)):
        assert watched.changed.wait(timeout=10), "no change came"
        watched.changed.clear()


def test_a_pass_costs_no_list_while_nothing_changes_and_changes_come_by_the_watch(
    world: World,
) -> None:
    world.create(pod("first"))
    world.controller.sync()  # the first pass lists each kind once, then watches
    assert mirrored("first").state == "queued"
    watching(world, "pods")
    watching(world, "jobs")
    before = reads(world, PODS), reads(world, JOBS)
    world.watched.changed.clear()  # type: ignore[attr-defined]
    for _ in range(3):
        world.controller.sync()
    assert (reads(world, PODS), reads(world, JOBS)) == before, "a pass listed"
    world.create(pod("second"))
    create_job(world, job("third", parallelism=1))
    arrived(world, "second", "third")
    world.controller.sync()
    assert mirrored("second").state == "queued"
    assert Job.objects.filter(spec__workload__name="third").exists()
    assert (reads(world, PODS), reads(world, JOBS)) == before, "a change was listed, not watched"
    world.fake.delete("pods", world.namespace, "second", 0)
    arrived(world, "second", gone=True)
    world.controller.sync()
    assert mirrored("second").state == "cancelled", "a deletion comes by the watch too"


def test_an_event_a_stalled_watch_missed_is_caught_by_the_periodic_relist(world: World) -> None:
    world.controller.sync()
    watching(world, "pods")
    # The pods' watch breaks without ending (a proxy stops forwarding): its next stream says
    # nothing after its backlog.
    world.fake.inject("stall", f"^{PODS}$", method="GET", watch=True)
    world.fake.end_watches()
    with world.fake.cond:
        assert world.fake.cond.wait_for(lambda: world.fake.faults[-1].remaining == 0, timeout=10)
    watching(world, "pods")
    world.create(pod("missed"))
    world.controller.sync()
    assert not Job.objects.exists(), "the stalled watch told nothing"
    world.clock.advance(60)  # the relist period
    world.controller.sync()
    assert mirrored("missed").state == "queued"


def test_a_relist_that_fails_fails_the_pass_and_changes_nothing(world: World) -> None:
    world.create(pod("kept"))
    world.controller.sync()
    world.clock.advance(60)
    world.fake.inject("503", f"^{PODS}$", method="GET", watch=False, count=100)
    with pytest.raises(Exception, match="503"):
        world.controller.sync()
    assert mirrored("kept").state == "queued", "a pod not listed is not a deleted pod"


def test_a_kind_the_api_server_does_not_serve_reads_as_none_held(world: World) -> None:
    watched: WatchedHeld = world.watched  # type: ignore[attr-defined]
    assert watched.list_held_objects("example.com", "v1", "widgets") == []
    assert not watched.cache("example.com", "v1", "widgets").served


def test_the_commands_loop_passes_at_a_change_not_at_its_interval_and_stops(world: World) -> None:
    """`run_workload_controller`'s loop (without `--once`): a pod created while it waits out a
    300 s interval is queued at once, because the watch's change starts the next pass; then
    the loop stops when told. The user's side runs in a thread and reads only the fake API
    server (the pass, in this thread, holds the test's database connection)."""
    seen: list[str] = []
    stop = threading.Event()

    def user() -> None:
        try:
            watching(world, "pods")
            world.create(pod("looped"))
            deadline = time.monotonic() + 60  # a bound on liveness, far below the interval
            while time.monotonic() < deadline and not seen:
                seen.extend(r for r, _ in world.events("looped") if r == "Queued")
                time.sleep(0.05)
        finally:
            stop.set()
            world.watched.changed.set()  # type: ignore[attr-defined]

    thread = threading.Thread(target=user)
    thread.start()
    Command._loop(world.controller, world.watched, stop, interval=300.0)  # type: ignore[attr-defined]
    thread.join()
    assert seen == ["Queued"], "the change did not start a pass"
    assert mirrored("looped").state == "queued"


def test_the_commands_loop_runs_the_next_pass_at_once_while_a_burst_is_left(
    world: World,
) -> None:
    """A pass that left workloads for the next (its queueing budget spent) is followed at
    once by the next pass, not after the interval: three pods, one a pass, all queued
    within a 300 s interval."""
    world.controller.queueing_budget_s = 0.0  # one workload a pass
    for i in range(3):
        world.create(pod(f"burst-{i}"))
    stop = threading.Event()
    passes: list[int] = []
    real = world.controller.sync

    def counted() -> Any:
        stats = real()
        passes.append(stats.deferred)
        if not stats.deferred:
            stop.set()
            world.watched.changed.set()  # type: ignore[attr-defined]
        return stats

    world.controller.sync = counted  # type: ignore[method-assign]
    timer = threading.Timer(60, stop.set)  # a bound on liveness, far below the interval
    timer.start()
    try:
        Command._loop(world.controller, world.watched, stop, interval=300.0)  # type: ignore[attr-defined]
    finally:
        timer.cancel()
    assert passes == [2, 1, 0]
    assert {mirrored(f"burst-{i}").state for i in range(3)} == {"queued"}


def _held(uid: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"name": uid, "uid": uid, "resourceVersion": str(rv)}}


def test_a_relist_keeps_what_the_watch_saw_while_the_list_was_answered() -> None:
    """A read's relist runs in the pass while the watch goes on in its own thread: the watch
    can apply a creation or a deletion newer than the list after the list was answered and
    before it replaces the cache. The list must not undo them: on the real plane, a pod group
    created as a relist was answered was neither queued nor refused for half a minute, until
    its pods changed again (else up to `relist_s` later). The interleaving is forced: the
    watch's events land inside the list call, through the handler the watch thread calls."""
    clock = [0.0]
    lists = [([_held("a", 3), _held("b", 4)], "5"), ([_held("a", 3), _held("b", 4)], "10")]
    streams_may_end = threading.Event()

    def list_all() -> tuple[list[dict[str, Any]], str]:
        items, rv = lists.pop(0)
        if rv == "10":  # answered at 10; then the watch sees c made and b deleted
            cache._event("ADDED", _held("c", 11))
            cache._event("DELETED", _held("b", 12))
        return items, rv

    def open_stream(rv: str, timeout_s: int) -> Any:
        streams_may_end.wait(10)
        raise ConnectionResetError("closed by the test")

    cache = HeldCache(
        list_all,
        open_stream,
        clock=lambda: clock[0],
        relist_s=60.0,
        changed=threading.Event(),
    )
    try:
        assert sorted(o["metadata"]["name"] for o in cache.items()) == ["a", "b"]
        clock[0] = 60.0  # the relist period: this read lists again
        assert sorted(o["metadata"]["name"] for o in cache.items()) == ["a", "c"]
    finally:
        cache.close()
        streams_may_end.set()


def test_the_daemons_sweep_of_held_jobs_reads_the_watch_not_a_list_every_sweep(
    world: World,
) -> None:
    """The sweep of held objects running without a live job (scheduler/daemon/strays.py) ran
    a list of every held Job every 10 s in the cycle: 1,500 Jobs held the cycle about 2 s of
    every 10 in Kueue's scenario. The deployed daemon (`watch_held`) lists once, then reads
    what the watch keeps, and still finds a Job unsuspended behind Gantry's back."""
    world.daemon.reconciler.close()
    world.daemon = Daemon(
        world.backend,
        lease=Lease("fake-k8s", ttl_s=30),
        clock=world.clock,
        sleep=lambda _s: None,
        watch_held=True,
    )
    for name in ("early", "late"):
        create_job(world, job(name, parallelism=1))
    world.controller.sync()
    # Held back from placement (a backoff), so that only the sweep acts on them.
    Job.objects.update(not_before=world.daemon.now_dt() + timedelta(hours=1))
    world.daemon.step()  # the first sweep lists, then watches
    watching(world, "jobs", streams=2)  # the controller's watch and the daemon's
    before = reads(world, JOBS)
    held = world.daemon.reconciler.held
    assert held is not None
    world.fake.mutate("jobs", world.namespace, "late", lambda o: o["spec"].update(suspend=False))
    deadline = time.monotonic() + 10
    while {j["metadata"]["name"]: j["spec"]["suspend"] for j in held.list_held_jobs()}["late"]:
        assert time.monotonic() < deadline, "the watch never showed the change"
        time.sleep(0.01)
    for _ in range(3):
        world.clock.advance(strays.HELD_JOBS_SWEEP_S)
        world.daemon.step()
    assert world.fake.get("jobs", world.namespace, "late")["spec"]["suspend"] is True
    assert reads(world, JOBS) == before, "a sweep listed the Jobs"
    world.daemon.reconciler.close()
