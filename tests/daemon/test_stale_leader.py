"""Issue 17, point 4: a leader that stalls inside a call to the cluster while its lease
expires and another daemon takes over must not write to the cluster afterwards: no delete,
no bind. The stall is a fake backend call that, while "blocked", lets the clock pass, the
lease expire and the new leader run a cycle (`SimulatedCluster.stall`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from scheduler.daemon.loop import Daemon
from scheduler.leader import LeaseLost
from tests.daemon.conftest import Env, assert_consistent, expire_leases


def stall_once(env: Env, method: str, meanwhile: Callable[[], None]) -> list[str]:
    """The next call of `method` stalls while `meanwhile` runs (the simulated cluster's
    `stall`), then completes as the cluster would have done it. Returns the log of the
    backend's write calls."""
    env.backend.stall(method, meanwhile)
    writes: list[str] = []
    for name in ("create_pod", "bind_pod", "delete_pod"):
        inner = getattr(env.backend, name)

        def logged(*args: Any, _inner: Any = inner, _name: str = name) -> Any:
            writes.append(f"{_name} {args[1] if _name != 'create_pod' else args[0].name}")
            return _inner(*args)

        setattr(env.backend, name, logged)
    return writes


def takeover(env: Env, new: Daemon) -> Callable[[], None]:
    def run() -> None:
        env.clock.advance(60)  # the stall outlasts the lease (30 s in these tests)
        expire_leases()
        env.run(new)

    return run


def test_a_stale_leader_stalled_listing_pods_deletes_none_of_the_new_leaders(env: Env) -> None:
    stale, new = env.daemon("stale"), env.daemon("new")
    env.run(stale)
    job = env.submit(simulation={"duration_s": 600})  # placed by the new leader, not the stale
    writes = stall_once(env, "list_pods", takeover(env, new))
    assert stale.step() is False  # reconcile: its listing came back after the takeover
    assert not stale.lease.leading
    job.refresh_from_db()
    assert job.state == "binding"  # the new leader's pod: an "orphan" to the stale one
    (pod,) = env.backend.list_pods()
    assert pod.job_id == job.pk and not pod.deleting
    assert [w for w in writes if w.startswith("delete_pod")] == []
    assert_consistent(env.backend)


def test_a_stale_leader_stalled_creating_a_pod_does_not_bind_it(env: Env) -> None:
    stale, new = env.daemon("stale"), env.daemon("new")
    env.run(stale)
    job = env.submit(simulation={"duration_s": 600})
    writes = stall_once(env, "create_pod", takeover(env, new))
    assert stale.step() is False  # claimed, then its create stalled past the lease
    stale_pod = f"gantry-{job.pk}-a0-r0"
    assert f"bind_pod {stale_pod}" not in writes
    pods = {p.name: p for p in env.backend.list_pods()}
    assert pods[stale_pod].node is None  # created by the stalled call, never bound
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)  # the new leader's own attempt
    assert pods[f"gantry-{job.pk}-a1-r0"].node is not None
    env.run(new, seconds=3)  # the stale leader's pod is an orphan to the new leader
    assert stale_pod not in {p.name for p in env.backend.list_pods()}
    assert_consistent(env.backend)


def test_a_write_to_the_cluster_is_not_sent_once_the_lease_has_passed(env: Env) -> None:
    """Every write goes through `Cluster.call`, which re-checks the lease once the
    daemon's clock has moved on."""
    stale = env.daemon("stale")
    env.run(stale)
    env.clock.advance(60)
    expire_leases()
    assert env.daemon("new").lease.acquire()
    sent: list[str] = []
    with pytest.raises(LeaseLost):
        stale.cluster.call(lambda: sent.append("delete"))
    assert sent == []
