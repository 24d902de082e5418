"""Issue 37: a cycle's pods created and bound concurrently, over the call pool's threads.

The backend here is a network cluster's worst case played in memory: every call can be held
(a stalled request), refused (a 500, a lost bind race) or slow, from several threads at once.
The lease is a stub that counts renewals and can be lost; nothing here touches the database.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from scheduler.backends.base import BackendError, BindConflict, PodRequest
from scheduler.daemon.apply import Plan
from scheduler.daemon.bind import bind_plan, failed_pods
from scheduler.daemon.calls import Call
from scheduler.daemon.cluster import Cluster
from scheduler.daemon.lease import LeaseKeeper
from scheduler.daemon.state import Clock
from scheduler.leader import LeaseLost
from tests.k8s.builders import make_request

WAIT_S = 5.0  # the longest a test waits for a thread; never reached when the code is right


class StubLease:
    def __init__(self, ttl_s: float = 30.0) -> None:
        self.ttl_s = ttl_s
        self.renewals = 0
        self.lost = False

    def renew(self, state: object = None) -> bool:
        self.renewals += 1
        return not self.lost


class NetworkCluster:
    """A backend whose calls take time and may hang or fail, from many threads at once."""

    creates_bound = False

    def __init__(self, max_in_flight: int = 4) -> None:
        self.max_in_flight = max_in_flight
        self.lock = threading.Lock()
        self.in_flight = self.peak = 0
        self.calls: list[tuple[str, str]] = []  # (kind, pod name), in the order they ended
        self.held: dict[tuple[str, str], threading.Event] = {}
        self.refused: dict[tuple[str, str], Exception] = {}
        self.delay_s = 0.0
        self.check: Callable[[], None] | None = None
        self.refused_by_fence = 0

    @contextlib.contextmanager
    def fenced(self, check: Callable[[], None]) -> Iterator[None]:
        before, self.check = self.check, check
        try:
            yield
        finally:
            self.check = before

    def hold(self, kind: str, name: str) -> threading.Event:
        self.held[(kind, name)] = gate = threading.Event()
        return gate

    def create_pod(self, pod: PodRequest) -> None:
        self._call("create", pod.name)

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        self._call("bind", name)

    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None:
        self._call("delete", name)

    def _call(self, kind: str, name: str) -> None:
        if self.check is not None:
            try:
                self.check()
            except LeaseLost:
                self.refused_by_fence += 1
                raise
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            if (gate := self.held.get((kind, name))) is not None:
                gate.wait(WAIT_S)
            if self.delay_s:
                time.sleep(self.delay_s)
            if (kind, name) in self.refused:
                raise self.refused[(kind, name)]
        finally:
            with self.lock:
                self.in_flight -= 1
                self.calls.append((kind, name))


def cluster_of(backend: NetworkCluster, lease: StubLease | None = None) -> Cluster:
    keeper = LeaseKeeper(lease or StubLease(), Clock(), state=lambda: None)  # type: ignore[arg-type]
    keeper.mark_renewed()
    return Cluster(backend, keeper)  # type: ignore[arg-type]


def plan_of(*jobs: tuple[int, int]) -> Plan:
    """Jobs as (job id, replicas): each replica a pod on its own node."""
    plan = Plan()
    for job_id, replicas in jobs:
        plan.pods[job_id] = [
            make_request(job_id, replica=r, replicas=replicas, node=f"gpu-{r}")
            for r in range(replicas)
        ]
        plan.allocations[job_id] = [job_id * 100 + r for r in range(replicas)]
        plan.claimed.add(job_id)
    return plan


def no_hook(name: str) -> None:
    return None


def test_a_cycles_pods_go_out_concurrently_never_more_than_max_in_flight() -> None:
    backend = NetworkCluster(max_in_flight=4)
    backend.delay_s = 0.02
    out = bind_plan(cluster_of(backend), plan_of(*((j, 1) for j in range(1, 13))), no_hook)
    assert sorted(out.bound) == list(range(1, 13)) and not out.failed
    assert backend.peak == 4  # as many as allowed at once, and no more
    assert sorted(backend.calls) == sorted(
        [(k, f"gantry-{j}-a0-r0") for j in range(1, 13) for k in ("create", "bind")]
    )


def test_the_simulated_cluster_is_called_in_order_in_the_daemons_thread() -> None:
    backend = NetworkCluster(max_in_flight=1)
    threads: set[str] = set()
    create = backend.create_pod
    backend.create_pod = lambda pod: (threads.add(threading.current_thread().name), create(pod))  # type: ignore[method-assign]
    out = bind_plan(cluster_of(backend), plan_of((1, 1), (2, 1)), no_hook)
    assert sorted(out.bound) == [1, 2]
    assert threads == {threading.current_thread().name}
    assert backend.calls == [
        ("create", "gantry-1-a0-r0"),
        ("create", "gantry-2-a0-r0"),
        ("bind", "gantry-1-a0-r0"),
        ("bind", "gantry-2-a0-r0"),
    ]


def test_no_job_waits_for_another_jobs_calls() -> None:
    """Job 1's create hangs; job 2 is created and bound meanwhile, not after it."""
    backend = NetworkCluster(max_in_flight=4)
    gate = backend.hold("create", "gantry-1-a0-r0")
    bound_before_release: list[bool] = []
    bind = backend.bind_pod

    def bind_noting(namespace: str, name: str, node: str) -> None:
        bound_before_release.append(not gate.is_set())
        bind(namespace, name, node)

    backend.bind_pod = bind_noting  # type: ignore[method-assign]
    release = threading.Timer(0.5, gate.set)
    release.start()
    out = bind_plan(cluster_of(backend), plan_of((1, 1), (2, 1)), no_hook)
    release.join()
    assert sorted(out.bound) == [1, 2]
    assert bound_before_release[0] is True  # job 2's bind went out while job 1's create hung
    assert backend.calls.index(("bind", "gantry-2-a0-r0")) < backend.calls.index(
        ("create", "gantry-1-a0-r0")
    )


def test_a_stalled_call_is_given_up_at_its_deadline_and_the_cycle_goes_on() -> None:
    backend = NetworkCluster(max_in_flight=4)
    gate = backend.hold("bind", "gantry-1-a0-r0")
    try:
        started = time.monotonic()
        out = bind_plan(cluster_of(backend), plan_of((1, 1), (2, 1)), no_hook, deadline_s=0.3)
        took = time.monotonic() - started
    finally:
        gate.set()
    assert out.bound == {2: [200]}
    assert out.failed == {1: "binding failed: no answer within 0.3 s"}
    assert took < WAIT_S  # not held until the stalled call ends


def test_a_call_stalled_behind_others_and_ahead_of_many_queued_is_given_up_alone() -> None:
    # Four threads, forty jobs: the tenth job's create stalls while the calls sent after it
    # still queue for a thread. It alone fails at its deadline; the others bind (the calls
    # not started yet have no deadline running).
    backend = NetworkCluster(max_in_flight=4)
    backend.delay_s = 0.005
    gate = backend.hold("create", "gantry-10-a0-r0")
    try:
        jobs = [(job_id, 1) for job_id in range(1, 41)]
        out = bind_plan(cluster_of(backend), plan_of(*jobs), no_hook, deadline_s=0.3)
    finally:
        gate.set()
    assert out.failed == {10: "creating pods failed: no answer within 0.3 s"}
    assert sorted(out.bound) == [j for j in range(1, 41) if j != 10]


def test_a_gang_binds_all_or_nothing() -> None:
    """One pod of a four-pod gang cannot be created: none of the gang's pods is bound, the
    job fails whole, and the other job binds."""
    backend = NetworkCluster(max_in_flight=8)
    backend.refused[("create", "gantry-1-a0-r2")] = BackendError("500 Internal Server Error")
    out = bind_plan(cluster_of(backend), plan_of((1, 4), (2, 1)), no_hook)
    assert out.bound == {2: [200]}
    assert out.failed == {1: "creating pods failed: 500 Internal Server Error"}
    assert not [c for c in backend.calls if c[0] == "bind" and c[1].startswith("gantry-1-")]


def test_a_gang_binds_only_once_all_its_pods_exist() -> None:
    backend = NetworkCluster(max_in_flight=8)
    gate = backend.hold("create", "gantry-1-a0-r3")
    threading.Timer(0.3, gate.set).start()
    out = bind_plan(cluster_of(backend), plan_of((1, 4)), no_hook)
    assert out.bound == {1: [100, 101, 102, 103]}
    first_bind = min(i for i, c in enumerate(backend.calls) if c[0] == "bind")
    assert backend.calls.index(("create", "gantry-1-a0-r3")) < first_bind


def test_a_bind_conflict_fails_its_job_only() -> None:
    backend = NetworkCluster(max_in_flight=4)
    backend.refused[("bind", "gantry-1-a0-r0")] = BindConflict("lost the race", "gpu-9")
    out = bind_plan(cluster_of(backend), plan_of((1, 1), (2, 1)), no_hook)
    assert out.bound == {2: [200]}
    assert out.failed == {1: "bind conflict (bound to gpu-9): lost the race"}
    assert not out.foreign  # ours, bound elsewhere: deleted at the commit, unlike a foreign pod


def test_a_pod_of_another_owner_under_our_name_is_left_alone() -> None:
    backend = NetworkCluster(max_in_flight=4)
    backend.refused[("create", "gantry-1-a0-r0")] = BindConflict("exists and is not ours")
    out = bind_plan(cluster_of(backend), plan_of((1, 1)), no_hook)
    assert out.foreign == {("team-a", "gantry-1-a0-r0")} and 1 in out.failed


def test_pods_created_bound_take_one_call_each() -> None:
    backend = NetworkCluster(max_in_flight=4)
    backend.creates_bound = True
    out = bind_plan(cluster_of(backend), plan_of((1, 2), (2, 1)), no_hook)
    assert sorted(out.bound) == [1, 2]
    assert sorted(k for k, _ in backend.calls) == ["create"] * 3


def test_the_lease_is_renewed_through_a_long_bind_phase() -> None:
    """A TTL of 0.6 s and binds that take 1.2 s in all: without renewals while waiting, the
    threads' fence would refuse the writes after 0.2 s."""
    lease = StubLease(ttl_s=0.6)
    backend = NetworkCluster(max_in_flight=2)
    backend.delay_s = 0.1
    out = bind_plan(cluster_of(backend, lease), plan_of(*((j, 1) for j in range(1, 13))), no_hook)
    assert sorted(out.bound) == list(range(1, 13)) and not out.failed
    assert lease.renewals >= 5 and backend.refused_by_fence == 0


def test_a_lease_lost_mid_bind_stops_every_thread_from_writing() -> None:
    lease = StubLease(ttl_s=0.6)
    backend = NetworkCluster(max_in_flight=2)
    backend.delay_s = 0.1
    threading.Timer(0.25, lambda: setattr(lease, "lost", True)).start()
    with pytest.raises(LeaseLost):
        bind_plan(cluster_of(backend, lease), plan_of(*((j, 1) for j in range(1, 21))), no_hook)
    written = len(backend.calls)
    time.sleep(0.4)  # the calls in flight end; none starts after the loss was found
    assert len(backend.calls) <= written + 2
    assert len(backend.calls) < 40  # far from every create and bind


def test_preempted_pods_are_deleted_concurrently_and_a_failed_delete_is_left_to_reconcile() -> None:
    backend = NetworkCluster(max_in_flight=4)
    backend.refused[("delete", "victim-2")] = BackendError("503 Service Unavailable")
    plan = replace(
        plan_of((1, 1)), deletions=[("team-b", "victim-1", 30), ("team-b", "victim-2", 30)]
    )
    out = bind_plan(cluster_of(backend), plan, no_hook)
    assert out.bound == {1: [100]}
    assert {("delete", "victim-1"), ("delete", "victim-2")} <= set(backend.calls)


def test_reconciles_deletions_go_out_concurrently_and_a_stalled_one_is_given_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ended pods are deleted by reconcile in bulk (a cycle after many jobs finished): all at
    once, at most max_in_flight; one refused and one stalled are logged and left to the next
    cycle, and the others are deleted meanwhile."""
    backend = NetworkCluster(max_in_flight=4)
    backend.delay_s = 0.02
    backend.refused[("delete", "done-3")] = BackendError("503 Service Unavailable")
    gate = backend.hold("delete", "done-5")
    cluster = cluster_of(backend)
    try:
        cluster.delete_pods([("team-a", f"done-{i}", 30) for i in range(12)], deadline_s=0.5)
    finally:
        gate.set()
    deleted = {name for kind, name in backend.calls if kind == "delete"}
    assert {f"done-{i}" for i in range(12)} - {"done-5"} <= deleted
    assert backend.peak == 4
    assert "could not delete pod team-a/done-3: 503 Service Unavailable" in caplog.text
    assert "could not delete pod team-a/done-5: no answer" in caplog.text


def test_pods_of_users_jobs_are_bound_concurrently_and_each_failure_is_returned() -> None:
    """The pods a user's Job made for its admitted replicas exist before Gantry binds them:
    reconcile binds them all at once, at most max_in_flight (one after the other, a
    Kueue-sized burst of Jobs took most of the daemon's time); a refused bind and a stalled
    one come back for the caller to judge, and the others are bound meanwhile."""
    backend = NetworkCluster(max_in_flight=4)
    backend.delay_s = 0.02
    conflict = BindConflict("bound elsewhere", bound_node="gpu-9")
    backend.refused[("bind", "job-3")] = conflict
    gate = backend.hold("bind", "job-5")
    binds = [("team-a", f"job-{i}", f"gpu-{i}") for i in range(12)]
    try:
        failed = cluster_of(backend).bind_pods(binds, deadline_s=0.5)
    finally:
        gate.set()
    assert set(failed) == {binds[3], binds[5]}
    assert failed[binds[3]] is conflict
    assert "no answer within 0.5 s" in str(failed[binds[5]])
    bound = {name for kind, name in backend.calls if kind == "bind"}
    assert {f"job-{i}" for i in range(12)} - {"job-5"} <= bound
    assert backend.peak == 4


def test_the_adopted_pods_of_jobs_made_in_kubernetes_go_out_together() -> None:
    """reconcile's `_bind_unbound`: every adopted pod still on no node, bound in one burst;
    `pods` shows each bound one on its node, and a refused one still unbound."""
    from scheduler.backends.base import PodPhase, PodStatus
    from scheduler.daemon.workloads import _bind_unbound

    backend = NetworkCluster(max_in_flight=4)
    backend.delay_s = 0.02
    backend.refused[("bind", "ddp-1")] = BackendError("500")
    job = {"id": 7, "spec__workload": {"kind": "Job", "name": "ddp", "uid": "u"}}
    allocs = [
        {"job_id": 7, "namespace": "team-a", "pod_name": f"ddp-{r}", "node__name": f"gpu-{r}"}
        for r in range(8)
    ]
    pods = {
        a["pod_name"]: PodStatus(a["pod_name"], "team-a", 7, 1, r, None, PodPhase.PENDING)
        for r, a in enumerate(allocs)
    }
    _bind_unbound(allocs, {7: job}, pods, cluster_of(backend))
    assert backend.peak == 4
    assert pods["ddp-0"].node == "gpu-0" and pods["ddp-7"].node == "gpu-7"
    assert pods["ddp-1"].node is None  # tried again at the next reconcile


def held(pod: PodRequest) -> PodRequest:
    """A user's pod, gated by Gantry's webhook: admitted, never created (issue 37)."""
    return replace(pod, held=True, held_uid="uid-then")


@pytest.mark.parametrize("max_in_flight", [1, 4], ids=["in-order", "threads"])
def test_a_users_held_pod_is_deleted_only_once_admitted(max_in_flight: int) -> None:
    """A gang of a user's held pods whose first admission fails (its pod was made again
    under its name: a new workload's): the job fails, and its pods not admitted are left
    to their user, gated (deleting the one whose call was never sent killed the new
    workload's pod); one that was admitted is Gantry's and deleted at the commit."""
    backend = NetworkCluster(max_in_flight=max_in_flight)
    plan = plan_of((1, 2))
    plan.pods[1] = [held(p) for p in plan.pods[1]]
    backend.refused[("create", "gantry-1-a0-r0")] = BindConflict("made again: not ours")
    out = bind_plan(cluster_of(backend), plan, no_hook)
    assert 1 in out.failed and out.foreign == {("team-a", "gantry-1-a0-r0")}
    assert failed_pods(plan, out) == [
        ("team-a", name, 0) for name in sorted(n for _, n in out.admitted)
    ]
    assert ("team-a", "gantry-1-a0-r1", 0) not in failed_pods(plan, replace(out, admitted=set()))
    # admitted, then its gang failed: Gantry's now, deleted
    backend = NetworkCluster(max_in_flight=1)
    backend.refused.clear()
    backend.refused[("create", "gantry-1-a0-r1")] = BindConflict("made again: not ours")
    out = bind_plan(cluster_of(backend), plan, no_hook)
    assert out.admitted == {("team-a", "gantry-1-a0-r0")}
    assert failed_pods(plan, out) == [("team-a", "gantry-1-a0-r0", 0)]


def test_a_call_its_thread_did_not_send_is_never_taken_as_an_admission(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The race behind a CI failure (29a00ba): a gang's second admission reaches its thread
    only after the first one's refusal was answered, so it is not sent. It was taken as sent
    and admitted, and the user's pod, made again under its name, was deleted at the commit."""
    from scheduler.daemon import bind

    backend = NetworkCluster(max_in_flight=4)
    plan = plan_of((1, 2))
    plan.pods[1] = [held(p) for p in plan.pods[1]]
    backend.refused[("create", "gantry-1-a0-r0")] = BindConflict("made again: not ours")
    first_answered = threading.Event()
    answered = bind._Binding._answered

    def answered_then_told(self: bind._Binding, call: object, error: BaseException | None) -> None:
        answered(self, call, error)  # type: ignore[arg-type]
        if getattr(call, "what", None) == plan.pods[1][0]:
            first_answered.set()

    monkeypatch.setattr(bind._Binding, "_answered", answered_then_told)
    cluster = cluster_of(backend)
    send = cluster.calls.send

    def second_sent_late(call: Call, fn: Callable[[], None]) -> Call:
        if call.what == plan.pods[1][1]:

            def late() -> None:
                assert first_answered.wait(WAIT_S)
                fn()

            return send(call, late)
        return send(call, fn)

    monkeypatch.setattr(cluster.calls, "send", second_sent_late)
    out = bind_plan(cluster, plan, no_hook)
    assert out.failed == {1: "creating pods failed: made again: not ours"}
    assert ("create", "gantry-1-a0-r1") not in backend.calls  # never sent
    assert out.admitted == set()
    assert failed_pods(plan, out) == []  # the user's pods stay, gated


def test_calls_outside_the_bind_phase_are_given_up_at_the_configured_deadline(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """GANTRY_CALL_DEADLINE_S bounds reconcile's deletions too (they used a fixed 15 s, the
    setting's default, whatever it was set to)."""
    settings.GANTRY_CALL_DEADLINE_S = 0.3
    backend = NetworkCluster(max_in_flight=4)
    gate = backend.hold("delete", "done-1")  # answers after WAIT_S (5 s) at the latest
    cluster = cluster_of(backend)
    started = time.monotonic()
    try:
        cluster.delete_pods([("team-a", f"done-{i}", 30) for i in range(3)])
    finally:
        gate.set()
    assert time.monotonic() - started < WAIT_S / 2
    assert "could not delete pod team-a/done-1: no answer within 0.3 s" in caplog.text
