"""FederatedBackend: several clusters behind the backend contract. Qualified node names and
labels, writes routed to the node's cluster, failures isolated (a silent cluster's nodes not
ready, its pods as last seen), the members' capabilities forwarded; and the daemon driving two
simulated clusters: a gang placed whole in the one cluster that can hold it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.conf import settings

from scheduler.backends.base import (
    BackendError,
    ConcurrentWrites,
    EventClock,
    FaultInjection,
    FencedWrites,
    InferenceLoad,
    PodPhase,
    PodRequest,
    PodWatching,
    UtilizationSource,
)
from scheduler.backends.federated import Member, federate
from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.clusters.backends import ClusterWatch, backend_for_clusters, last_known
from scheduler.models import Allocation, Cluster, Job, JobState
from tests.conftest import build_org
from tests.daemon.conftest import Env, FakeClock, watched
from tests.k8s.builders import make_request

METHODS = (
    "list_nodes",
    "list_pods",
    "create_pod",
    "bind_pod",
    "delete_pod",
    "set_node_unschedulable",
)


def sim(count: int, prefix: str, clock: Any = None) -> SimulatedCluster:
    return SimulatedCluster(
        make_nodes(count, "H100-80GB", 8, prefix=prefix),
        clock=clock or FakeClock(),
        start_delay_s=1.0,
        grace_cap_s=2.0,
        retry_sleep=lambda _s: None,
    )


def down(cluster: SimulatedCluster) -> None:
    """The cluster stops answering: every call fails as an unreachable API server's does
    (a transient error after the backend's own retries)."""
    for method in METHODS:
        cluster.inject(method, BackendError("connection refused"), times=10_000)


def up(cluster: SimulatedCluster) -> None:
    cluster._faults.clear()


def pod(name: str, node: str, job_id: int = 1) -> PodRequest:
    return PodRequest(
        name, "proj", job_id, 0, 0, 1, node, (0,), 1000, None, 1000, 1024, "img", ("run",),
        {}, "normal", "training",
    )  # fmt: skip


@pytest.fixture
def two() -> tuple[Any, SimulatedCluster, SimulatedCluster]:
    home, b = sim(1, "h"), sim(2, "n")
    members = [
        Member("local", home, home=True),
        Member("b", b, labels={"region": "eu", "site": "b1"}),
    ]
    # asked again at every call: these tests do not wait out a silent cluster's quiet time
    fed = federate(members, probe_every_s=0.0)
    return fed, home, b


def test_nodes_are_qualified_and_labelled(two: Any) -> None:
    fed, _, _ = two
    nodes = {n.name: n for n in fed.list_nodes()}
    assert sorted(nodes) == ["b:n-0000", "b:n-0001", "h-0000"]
    assert nodes["h-0000"].labels["gantry.io/cluster"] == "local"
    assert {k: v for k, v in nodes["b:n-0000"].labels.items() if k.startswith("gantry.io/")} == {
        "gantry.io/cluster": "b",
        "gantry.io/region": "eu",
        "gantry.io/site": "b1",
    }


def test_writes_go_to_the_nodes_cluster_under_its_own_name(two: Any) -> None:
    fed, home, b = two
    fed.list_nodes()
    fed.create_pod(pod("p1", "b:n-0001"))
    fed.bind_pod("proj", "p1", "b:n-0001")
    assert [(p.name, p.node) for p in b.list_pods()] == [("p1", "n-0001")]
    assert list(home.list_pods()) == []
    assert [(p.name, p.node) for p in fed.list_pods()] == [("p1", "b:n-0001")]
    fed.set_node_unschedulable("b:n-0000", True)
    assert {n.name: n.unschedulable for n in b.list_nodes()} == {"n-0000": True, "n-0001": False}
    fed.delete_pod("proj", "p1", 0)
    assert all(p.deleting for p in b.list_pods()) or not list(b.list_pods())


def test_a_node_of_no_driven_cluster_is_refused(two: Any) -> None:
    fed, _, _ = two
    with pytest.raises(BackendError, match="no cluster 'c'"):
        fed.create_pod(pod("p1", "c:n-0000"))


def test_a_silent_cluster_fails_only_its_own_calls_and_its_pods_stay_as_last_seen(
    two: Any,
) -> None:
    fed, home, b = two
    fed.list_nodes()
    fed.create_pod(pod("p1", "b:n-0000"))
    fed.bind_pod("proj", "p1", "b:n-0000")
    fed.list_pods()
    down(b)
    nodes = {n.name: (n.ready, n.unschedulable) for n in fed.list_nodes()}
    # held: ready (its jobs are not failed) but nothing new placed there
    assert nodes == {"h-0000": (True, False), "b:n-0000": (True, True), "b:n-0001": (True, True)}
    assert [(p.name, p.node) for p in fed.list_pods()] == [("p1", "b:n-0000")]  # held, not gone
    assert fed.answered == {"local": True, "b": False}
    fed.create_pod(pod("p2", "h-0000", job_id=2))  # the home cluster still takes writes
    assert [p.name for p in home.list_pods()] == ["p2"]
    with pytest.raises(BackendError):
        fed.create_pod(pod("p3", "b:n-0001", job_id=3))
    fed.set_node_unschedulable("b:n-0001", True)  # skipped: it would only fail
    fed.lost = {"b"}  # past its deadline: NotReady, so its jobs are retried elsewhere
    assert {n.name: n.ready for n in fed.list_nodes()}["b:n-0000"] is False
    up(b)
    assert {n.name: n.ready for n in fed.list_nodes()} == {
        "h-0000": True,
        "b:n-0000": True,
        "b:n-0001": True,
    }
    assert fed.answered == {"local": True, "b": True}


def test_a_silent_cluster_is_asked_again_only_after_its_quiet_time() -> None:
    clock, home, b = FakeClock(), sim(1, "h"), sim(1, "n")
    fed = federate(
        [Member("local", home, home=True), Member("b", b)], clock=clock, probe_every_s=10
    )
    down(b)
    fed.list_nodes()
    asked = b.calls["list_nodes"]
    clock.advance(9)
    fed.list_nodes()
    assert b.calls["list_nodes"] == asked  # not asked within 10 s
    with pytest.raises(BackendError, match="does not answer"):  # nor written to
        fed.delete_pod("proj", "p1", 0)
    assert "delete_pod" not in b.calls
    up(b)
    clock.advance(1)
    assert "b:n-0000" in {n.name for n in fed.list_nodes() if n.ready}


def test_a_silent_clusters_event_clock_does_not_wake_the_daemon_until_it_answers() -> None:
    """bench.chaos --lose-cluster: the daemon cycled some 380 times a second while a cluster
    was silent, its pods' ends (never seen, the lists failing) always an event past."""
    clock = FakeClock()
    home, b = sim(1, "h", clock), sim(1, "n", clock)
    fed = federate([Member("local", home, home=True), Member("b", b)], probe_every_s=0.0)
    request = make_request(node="b:n-0000", sim_duration_s=10.0)
    fed.create_pod(request)
    fed.bind_pod(request.namespace, request.name, request.node)
    fed.list_pods()
    assert fed.next_event_at() == clock() + 1.0  # its start, 1 s after binding
    down(b)
    clock.advance(60)  # started at 1 s, ended at 11 s: unseen
    fed.list_pods()
    assert fed.next_event_at() is None
    up(b)
    fed.list_pods()  # seen ended: nothing more to come
    assert fed.next_event_at() is None


def test_capabilities_are_those_the_members_offer(two: Any) -> None:
    fed, _, _ = two
    for protocol in (FencedWrites, EventClock, FaultInjection, InferenceLoad, UtilizationSource):
        assert isinstance(fed, protocol), protocol
    # the simulated cluster is called in order and does not watch: neither does the whole
    assert not isinstance(fed, ConcurrentWrites)
    assert not isinstance(fed, PodWatching)
    only_plain = federate([Member("local", _Plain(), home=True), Member("b", _Plain())])
    assert not isinstance(only_plain, EventClock | FaultInjection | UtilizationSource)


class _Plain:
    """A backend with the contract's methods only."""

    def list_nodes(self) -> list[Any]:
        return []

    def list_pods(self) -> list[Any]:
        return []

    def create_pod(self, pod: PodRequest) -> None: ...

    def bind_pod(self, namespace: str, name: str, node: str) -> None: ...

    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None: ...

    def set_node_unschedulable(self, node: str, unschedulable: bool) -> None: ...


class _Concurrent(_Plain):
    """A member whose writes are network calls and that creates pods bound."""

    def __init__(self) -> None:
        self.created: list[tuple[str, str]] = []

    max_in_flight = 8
    creates_bound = True

    def create_pod(self, pod: PodRequest) -> None:
        self.created.append((pod.name, pod.node))


def test_a_concurrent_member_makes_the_whole_concurrent_and_the_others_bind_after_create() -> None:
    home, remote = sim(1, "h"), _Concurrent()
    fed = federate([Member("local", home, home=True), Member("b", remote)])
    assert isinstance(fed, ConcurrentWrites)
    assert (fed.max_in_flight, fed.creates_bound) == (9, True)
    fed.list_nodes()
    fed.create_pod(pod("p1", "b:n-0000"))
    fed.create_pod(pod("p2", "h-0000", job_id=2))
    assert remote.created == [("p1", "n-0000")]
    # the daemon binds no pod of a backend that creates them bound: the home one is bound here
    assert [(p.name, p.node) for p in home.list_pods()] == [("p2", "h-0000")]


def test_the_device_readings_and_fault_injection_are_routed(two: Any) -> None:
    fed, _, b = two
    fed.list_nodes()
    fed.fail_node("b:n-0000")
    assert b.node_failed("n-0000") and fed.node_failed("b:n-0000") and not fed.node_failed("h-0000")
    nodes = {r.node for r in fed.device_readings()}
    assert "b:n-0001" in nodes and "h-0000" in nodes and "n-0001" not in nodes


# --- with the daemon -----------------------------------------------------------------------


@pytest.fixture
def fenv(db: Any) -> Iterator[tuple[Env, SimulatedCluster, SimulatedCluster]]:
    org = build_org()
    clock = FakeClock()
    home, b = sim(1, "h100", clock), sim(2, "h100", clock)
    Cluster.objects.create(name="b", backend="simulated", labels={"region": "eu"})
    fed = federate(
        [Member("local", home, home=True), Member("b", b, labels={"region": "eu"})], clock=clock
    )
    for env in watched(Env(org, clock, fed)):  # type: ignore[arg-type]
        yield env, home, b


def test_the_daemon_places_a_gang_whole_in_the_cluster_that_holds_it(fenv: Any) -> None:
    env, home, b = fenv
    daemon = env.daemon()
    gang = env.submit(replicas=2, resources={"gpus": 8}, simulation={"duration_s": 10_000})
    env.run(daemon, seconds=2, cycles=3)
    gang.refresh_from_db()
    assert gang.state == JobState.RUNNING
    nodes = set(Allocation.objects.filter(job=gang).values_list("node__name", flat=True))
    assert nodes == {"b:h100-0000", "b:h100-0001"}
    assert {p.node for p in b.list_pods()} == {"h100-0000", "h100-0001"}
    assert list(home.list_pods()) == []
    assert (
        Allocation.objects.filter(job=gang).values_list("node__cluster__name", flat=True)[0] == "b"
    )


def test_a_silent_cluster_keeps_its_jobs_held_while_the_other_schedules(fenv: Any) -> None:
    env, home, b = fenv
    daemon = env.daemon()
    on_b = env.submit(replicas=2, resources={"gpus": 8}, simulation={"duration_s": 10_000})
    env.run(daemon, seconds=2, cycles=3)
    down(b)
    later = env.submit(replicas=1, resources={"gpus": 8}, simulation={"duration_s": 10_000})
    env.run(daemon, seconds=2, cycles=3)
    on_b.refresh_from_db()
    later.refresh_from_db()
    # within the node-lost grace the gang on b is running (charged and held), not requeued
    assert on_b.state == JobState.RUNNING
    assert later.state == JobState.RUNNING
    assert set(Allocation.objects.filter(job=later).values_list("node__name", flat=True)) == {
        "h100-0000"
    }
    assert [p.name for p in home.list_pods()] == [f"gantry-{later.pk}-a0-r0"]


def test_one_cluster_row_drives_exactly_the_backend_as_before(db: Any) -> None:
    home = sim(1, "h")
    assert backend_for_clusters(home) is home
    Cluster.objects.create(name="b", backend="simulated")
    fed = backend_for_clusters(home)
    assert fed is not home and sorted(fed.members) == ["b", "local"]


def test_a_simulated_cluster_has_the_simulated_homes_hardware(db: Any) -> None:
    """Not the demo's: the home's nodes (`run_scheduler --nodes-csv`) are the flavors the
    tenants hold quota for, and a cluster beside it of other flavors could run none of it."""
    home = sim(2, "h")
    Cluster.objects.create(name="b", backend="simulated")
    fed = backend_for_clusters(home)
    assert sorted(n.name for n in fed.members["b"].backend.list_nodes()) == [
        "h-0000",
        "h-0001",
    ]


def test_a_cluster_silent_since_the_start_is_held_as_the_ledger_says(fenv: Any) -> None:
    env, _, _ = fenv
    daemon = env.daemon()
    gang = env.submit(replicas=2, resources={"gpus": 8}, simulation={"duration_s": 10_000})
    env.run(daemon, seconds=2, cycles=3)
    seeded = last_known(list(Cluster.objects.all()), "local")
    assert {(p.name, p.node, p.phase) for p in seeded["b"].pods} == {
        (f"gantry-{gang.pk}-a0-r0", "b:h100-0000", PodPhase.RUNNING),
        (f"gantry-{gang.pk}-a0-r1", "b:h100-0001", PodPhase.RUNNING),
    }
    assert Job.objects.get(pk=gang.pk).state == JobState.RUNNING


def test_a_leader_starting_while_a_cluster_is_silent_holds_its_nodes_as_last_synced(
    fenv: Any,
) -> None:
    """bench.chaos --lose-cluster: a standby that took over during the outage had never listed
    the cluster, reported no node of it, and the daemon failed its jobs at once ("gone from
    the cluster"), not at the deadline. Seeded from the database, they are held (unschedulable,
    ready) as the previous leader last saw them."""
    env, home, b = fenv
    daemon = env.daemon()
    gang = env.submit(replicas=2, resources={"gpus": 8}, simulation={"duration_s": 10_000})
    env.run(daemon, seconds=2, cycles=3)
    down(b)
    members = [Member("local", home, home=True), Member("b", b, labels={"region": "eu"})]
    standby = federate(members, seed=last_known(list(Cluster.objects.all()), "local"))
    held = {n.name: n for n in standby.list_nodes() if n.name.startswith("b:")}
    assert sorted(held) == ["b:h100-0000", "b:h100-0001"]
    assert all(n.ready and n.unschedulable for n in held.values())
    assert [len(n.gpus) for n in held.values()] == [8, 8]
    assert held["b:h100-0000"].labels["gantry.io/cluster"] == "b"
    assert Job.objects.get(pk=gang.pk).state == JobState.RUNNING


def test_a_new_leader_holds_a_silent_cluster_as_the_ledger_says_not_as_it_last_listed(
    fenv: Any,
) -> None:
    """bench.chaos --lose-cluster: a scheduler that had led before, listing the cluster empty,
    took the lease back during its outage and held it as it had listed it: the gang another
    leader had placed there since read as vanished, failed 12 s into a 30 s deadline."""
    env, home, b = fenv
    members = [Member("local", home, home=True), Member("b", b, labels={"region": "eu"})]
    standby = federate(members, clock=env.clock)
    assert not [p for p in standby.list_pods()]  # it led once, when nothing ran
    called: list[str] = []
    daemon = env.daemon(hooks={"leading": lambda: called.append("leading")})
    gang = env.submit(replicas=2, resources={"gpus": 8}, simulation={"duration_s": 10_000})
    env.run(daemon, seconds=2, cycles=3)  # another leader places the gang on b
    assert called == ["leading"]  # once, when it took the lease
    down(b)
    ClusterWatch(standby).on_lead()  # the hook run_scheduler gives its daemon
    assert {p.name for p in standby.list_pods()} == {
        f"gantry-{gang.pk}-a0-r0",
        f"gantry-{gang.pk}-a0-r1",
    }


def test_a_cluster_silent_past_its_deadline_is_lost_and_its_job_runs_elsewhere(fenv: Any) -> None:
    env, home, b = fenv
    Cluster.objects.filter(name="b").update(lost_after_s=60)
    watch = ClusterWatch(env.backend)
    daemon = env.daemon(on_cycle=watch.tick)
    job = env.submit(
        resources={"gpus": 8},
        simulation={"duration_s": 10_000},
        placement={"preferred_clusters": ["b"]},
        retry={"limit": 2, "backoff_s": 0},
    )
    env.run(daemon, seconds=2, cycles=3)
    assert Allocation.objects.get(job=job).node.name == "b:h100-0000"
    down(b)
    env.run(daemon, seconds=20, cycles=3)  # 60 s silent: within the deadline, held
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, 0)
    assert Cluster.objects.get(name="b").state == "active"
    env.run(daemon, seconds=20, cycles=4)  # past it: lost, the attempt failed
    job.refresh_from_db()
    assert Cluster.objects.get(name="b").state == "lost"
    # fenced: the next attempt waits while the old one's pod is not confirmed gone (the
    # lost cluster cannot confirm its deletion) until the node-lost grace has passed
    assert (job.state, job.attempt) == (JobState.QUEUED, 1)
    assert Allocation.objects.filter(job=job, attempt=0, ended_at__isnull=True).exists()
    env.run(daemon, seconds=settings.GANTRY_NODE_LOST_GRACE_S / 2, cycles=3)
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
    now_on = Allocation.objects.get(job=job, ended_at__isnull=True).node.name
    assert now_on == "h100-0000"
    assert [p.name for p in home.list_pods()] == [f"gantry-{job.pk}-a1-r0"]
    # b answers again: active, and the stale attempt's pod there is deleted as an orphan
    up(b)
    env.run(daemon, seconds=5, cycles=3)  # asked again once its quiet time (10 s) is over
    assert Cluster.objects.get(name="b").state == "active"
    assert all(p.deleting for p in b.list_pods()), b.list_pods()
    env.run(daemon, seconds=5, cycles=2)
    assert list(b.list_pods()) == []
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.RUNNING, 1)
