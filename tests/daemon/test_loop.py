"""The daemon's loop (`scheduler.daemon.loop`): it watches the backend's pods, goes again at
once only after a cycle that changed what the next may decide, waits until just after the
next pod event, and runs with a collector tuned for many short-lived objects."""

from __future__ import annotations

import threading
from typing import Any


def test_the_daemon_loop_watches_the_backends_pods(env: Any) -> None:
    """`Daemon.run` starts the backend's pod watch (when it has one), waits on its event,
    and closes the watch when it stops."""
    from scheduler.daemon.loop import Daemon
    from scheduler.leader import Lease

    calls: list[str] = []

    class Watching:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def watch_pods(self, stop: threading.Event) -> threading.Event:
            calls.append("watch")
            return threading.Event()

        def close_watches(self) -> None:
            calls.append("close")

    job = env.submit(simulation={"duration_s": 600})
    daemon = Daemon(Watching(env.backend), lease=Lease("watching", ttl_s=30), clock=env.clock)
    daemon.hooks = {"claimed": daemon.stop.set}
    daemon.run()
    job.refresh_from_db()
    assert job.state == "binding"
    assert calls == ["watch", "close"]


def test_only_a_cycle_that_changed_what_the_next_may_decide_goes_again_at_once(env: Any) -> None:
    """`step()` is True after a cycle that placed a job or saw one end (its devices are
    free: the next cycle may place more), False after one that only saw pods start (that
    frees nothing): the loop then waits for the next event instead of running a cycle that
    finds nothing new."""
    from scheduler.models import Job

    job = env.submit(simulation={"duration_s": 60}, resources={"gpus": 8})
    daemon = env.daemon()
    assert daemon.step() is True  # placed and bound
    env.clock.advance(5)  # past the simulated start delay
    assert daemon.step() is False  # seen running: written, and nothing more to decide
    assert Job.objects.get(pk=job.pk).state == "running"
    assert daemon.last is not None and (daemon.last.started, daemon.last.reconciled) == (1, 0)
    env.clock.advance(60)
    assert daemon.step() is True  # seen succeeded: its devices are free
    assert Job.objects.get(pk=job.pk).state == "succeeded"
    assert daemon.step() is False  # nothing at all


def test_the_daemon_waits_until_just_after_the_backends_next_pod_event(env: Any) -> None:
    """Between cycles the daemon sleeps until the simulated cluster's next pod event and a
    hair more (so the event has happened when reconcile looks): 2 ms, not 10, since every
    wait for a pod's end holds its GPUs idle that much longer."""
    from scheduler.daemon.loop import Daemon
    from scheduler.leader import Lease

    env.submit(simulation={"duration_s": 5})
    daemon = Daemon(env.backend, lease=Lease("timing", ttl_s=30), clock=env.clock, interval_s=30)
    daemon.lease.acquire()
    env.run(daemon, cycles=3)  # placed, bound, started
    next_event = env.backend.next_event_at()
    assert next_event is not None
    timeout = daemon._timeout()
    assert next_event - env.clock() < timeout <= next_event - env.clock() + 0.002


def test_the_daemon_loop_runs_with_a_collector_for_many_short_lived_objects(env: Any) -> None:
    """While `run` loops, what existed before is frozen out of the collector's view and
    young collections are rarer; both are restored when it returns."""
    import gc

    from scheduler.daemon.loop import Daemon
    from scheduler.daemon.phases import GC_THRESHOLDS
    from scheduler.leader import Lease

    before = gc.get_threshold()
    seen: list[tuple[tuple[int, ...], int]] = []

    def on_cycle(d: Daemon) -> None:
        seen.append((gc.get_threshold(), gc.get_freeze_count()))
        d.stop.set()

    daemon = Daemon(env.backend, lease=Lease("gc", ttl_s=30), clock=env.clock, on_cycle=on_cycle)
    daemon.run()
    assert seen and seen[0][0] == GC_THRESHOLDS and seen[0][1] > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
