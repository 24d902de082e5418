"""The simulated cluster's state in a file (`PersistentCluster`): pods outlive the process that
made them, and every process on the host sees the same cluster (issue 17, point 10: every
failover or restart made every running pod vanish, and 94 of 777 jobs failed "node lost")."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.backends.base import BackendError, PodPhase
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.backends.simulated.statefile import PersistentCluster
from tests.daemon.conftest import FakeClock
from tests.k8s.builders import make_request


def cluster(path: Path, clock: FakeClock) -> PersistentCluster:
    nodes = make_nodes(2, "H100-80GB", 8, prefix="h100")
    return PersistentCluster(nodes, path, clock=clock, start_delay_s=1.0, grace_cap_s=2.0)


def phases(backend: PersistentCluster) -> dict[str, PodPhase]:
    return {p.name: p.phase for p in backend.list_pods()}


def test_pods_outlive_the_process_and_keep_their_times(tmp_path: Path) -> None:
    clock = FakeClock()
    first = cluster(tmp_path / "cluster.state", clock)
    pod = make_request(node="h100-0000", sim_duration_s=100.0)
    first.create_pod(pod)
    first.bind_pod(pod.namespace, pod.name, "h100-0000")
    clock.advance(5)
    assert phases(first) == {pod.name: PodPhase.RUNNING}
    del first  # the scheduler's process ends; the cluster does not
    clock.advance(50)
    restarted = cluster(tmp_path / "cluster.state", clock)
    assert phases(restarted) == {pod.name: PodPhase.RUNNING}
    clock.advance(50)  # bound at 0, started at 1, runs 100 s: done at 101
    assert phases(restarted) == {pod.name: PodPhase.SUCCEEDED}


def test_two_processes_see_and_change_one_cluster(tmp_path: Path) -> None:
    clock = FakeClock()
    leader, standby = cluster(tmp_path / "c.state", clock), cluster(tmp_path / "c.state", clock)
    pod = make_request(node="h100-0001", sim_duration_s=600.0)
    leader.create_pod(pod)
    leader.bind_pod(pod.namespace, pod.name, "h100-0001")
    clock.advance(2)
    [seen] = standby.list_pods()
    assert (seen.name, seen.node, seen.phase) == (pod.name, "h100-0001", PodPhase.RUNNING)
    standby.delete_pod(pod.namespace, pod.name, grace_period_s=30)  # the new leader preempts
    [deleting] = leader.list_pods()
    assert deleting.deleting
    clock.advance(3)  # the grace (capped at 2 s) has passed
    assert leader.list_pods() == [] and standby.list_pods() == []


def test_node_failures_partitions_cordons_and_stuck_pods_are_kept(tmp_path: Path) -> None:
    clock = FakeClock()
    first = cluster(tmp_path / "c.state", clock)
    first.fail_node("h100-0000")
    first.partition_node("h100-0001")
    first.set_node_unschedulable("h100-0001", True)
    first.never_start(42)
    stuck = make_request(42, node="h100-0001")
    first.create_pod(stuck)
    again = cluster(tmp_path / "c.state", clock)
    ready = {n.name: (n.ready, n.unschedulable) for n in again.list_nodes()}
    assert ready == {"h100-0000": (False, False), "h100-0001": (False, True)}
    assert again.node_failed("h100-0000")
    again.heal_node("h100-0001")
    again.bind_pod(stuck.namespace, stuck.name, "h100-0001")
    clock.advance(60)
    [pod] = again.list_pods()
    assert pod.phase == PodPhase.PENDING and "ImagePullBackOff" in (pod.waiting or "")


def test_an_unreadable_state_is_set_aside_and_the_cluster_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "c.state"
    path.write_bytes(b"not a pickle")
    backend = cluster(path, FakeClock())
    assert backend.list_pods() == []
    assert (tmp_path / "c.state.unreadable").read_bytes() == b"not a pickle"


def test_a_stalled_call_lets_another_process_use_the_cluster_meanwhile(tmp_path: Path) -> None:
    clock = FakeClock()
    stalled, other = cluster(tmp_path / "c.state", clock), cluster(tmp_path / "c.state", clock)
    pod = make_request(node="h100-0000")
    stalled.stall("list_pods", lambda: other.create_pod(pod))  # no deadlock on the file lock
    assert [p.name for p in stalled.list_pods()] == [pod.name]  # served after, seeing it
    assert [p.name for p in stalled.list_pods()] == [pod.name]  # one stall only


def test_a_lost_cluster_fails_every_api_call_of_every_process_until_restored(
    tmp_path: Path,
) -> None:
    """The outage is the file's: a daemon's calls (another process's object) time out, never
    answer empty, while the pods go on running as the observer (a test harness) sees."""
    clock = FakeClock()
    path = tmp_path / "c.state"
    daemon, harness = cluster(path, clock), cluster(path, clock)
    observer = PersistentCluster(make_nodes(2, "H100-80GB", 8, prefix="h100"), path, clock=clock,
                                 observer=True)  # fmt: skip
    pod = make_request(node="h100-0000", sim_duration_s=100.0)
    daemon.create_pod(pod)
    daemon.bind_pod(pod.namespace, pod.name, "h100-0000")
    harness.lose(stall_s=0)
    clock.advance(5)
    calls = (
        daemon.list_nodes,
        daemon.list_pods,
        daemon.device_readings,
        lambda: daemon.delete_pod(pod.namespace, pod.name),
        lambda: daemon.create_pod(make_request(node="h100-0001", job_id=2)),
        lambda: daemon.set_node_unschedulable("h100-0001", True),
    )
    for call in calls:
        with pytest.raises(BackendError, match="did not answer"):
            call()
    assert phases(observer) == {pod.name: PodPhase.RUNNING}  # nothing deleted, nothing made
    harness.restore()
    assert phases(daemon) == {pod.name: PodPhase.RUNNING}
    assert not any(node.unschedulable for node in daemon.list_nodes())
