"""The simulated cluster's event clock (`SimulatedCluster.next_event_at`): when the daemon
should look at the pods next. A pod that ended since the pods were last listed is due at
once, as a watch would have said; starts and disappearances are looked for only ahead."""

from __future__ import annotations

from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from tests.backends.simulated.test_cluster import request
from tests.daemon.conftest import FakeClock


def bound(cluster: SimulatedCluster, job_id: int, seconds: float) -> str:
    pod = request(job_id, "training", node=f"n-000{job_id}", hours=seconds / 3600)
    cluster.create_pod(pod)
    cluster.bind_pod("ns", pod.name, pod.node)
    return pod.name


def test_an_end_since_the_pods_were_listed_is_due_at_once() -> None:
    clock = FakeClock()
    cluster = SimulatedCluster(make_nodes(2, "H100-80GB", 1, prefix="n"), clock=clock,
                               start_delay_s=1.0)  # fmt: skip
    t0 = clock()
    bound(cluster, 0, 10)
    bound(cluster, 1, 20)
    assert cluster.next_event_at() == t0 + 1  # both start
    clock.advance(2)
    cluster.list_pods()  # both seen running
    assert cluster.next_event_at() == t0 + 11  # the first end, ahead
    clock.advance(10)  # it ended; nobody listed the pods since
    assert cluster.next_event_at() == t0 + 11  # already past: look now
    cluster.list_pods()
    assert cluster.next_event_at() == t0 + 21  # seen: the next end is the other one's


def test_a_start_already_past_is_not_looked_for() -> None:
    clock = FakeClock()
    cluster = SimulatedCluster(make_nodes(1, "H100-80GB", 1, prefix="n"), clock=clock,
                               start_delay_s=0.0)  # fmt: skip
    cluster.list_pods()
    clock.advance(1)
    bound(cluster, 0, 10)  # starts at once, after the last listing
    assert cluster.next_event_at() == clock() + 10  # its end, not its start


def test_a_pod_deleted_at_once_is_not_looked_for() -> None:
    clock = FakeClock()
    cluster = SimulatedCluster(make_nodes(1, "H100-80GB", 1, prefix="n"), clock=clock,
                               start_delay_s=0.0, grace_cap_s=0.0)  # fmt: skip
    name = bound(cluster, 0, 10)
    cluster.list_pods()
    clock.advance(1)
    cluster.delete_pod("ns", name, grace_period_s=0)  # gone while the daemon looks
    assert cluster.next_event_at() is None
