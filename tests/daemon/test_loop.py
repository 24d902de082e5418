"""The daemon's loop (`scheduler.daemon.loop`): it watches the backend's pods, goes again at
once only after a cycle after which more may be placed, waits until just after the next pod
event, and runs with a collector tuned for many short-lived objects."""

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


def test_only_a_cycle_after_which_more_may_be_placed_goes_again_at_once(env: Any) -> None:
    """`step()` is True after a cycle that placed jobs and left GPUs free (the jobs behind
    them may take what is left), False after one that filled the cluster, saw pods start,
    or saw a job end and had nothing to place: the next cycle could decide nothing new
    before the next event, so the loop waits for it."""
    from scheduler.models import Job

    def job(seconds: float) -> Job:
        return env.submit(simulation={"duration_s": seconds}, resources={"gpus": 8})

    first = job(60)
    daemon = env.daemon()
    assert daemon.step() is True  # placed, 24 of the 32 GPUs left
    assert daemon.last is not None and daemon.last.gpu_left == 24_000
    env.clock.advance(5)  # past the simulated start delay
    assert daemon.step() is False  # seen running: written, and nothing more to decide
    assert Job.objects.get(pk=first.pk).state == "running"
    assert (daemon.last.started, daemon.last.reconciled, daemon.last.placed) == (1, 0, 0)
    others = [job(600) for _ in range(3)]
    assert daemon.step() is False  # three placed, and no GPU left for anyone behind them
    assert (daemon.last.placed, daemon.last.gpu_left) == (3, 0)
    env.clock.advance(60)
    assert daemon.step() is False  # `first` ended and nothing waits for its GPUs
    assert Job.objects.get(pk=first.pk).state == "succeeded"
    assert daemon.last.reconciled == 1
    assert {j.state for j in Job.objects.filter(pk__in=[o.pk for o in others])} == {"running"}


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
