"""Node health and admin actions through the daemon (`scheduler.daemon.nodes`); the node-agent
report; the database's guard against allocating a device twice."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduler.daemon import nodes as nodes_module
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, Node, NodeAgent
from scheduler.nodes.services import node_set_failed
from tests import factories as f
from tests.daemon.conftest import Env, assert_consistent


def node_of(job: Job) -> str:
    """The node of the job's current attempt (an older attempt may still be stopping)."""
    job.refresh_from_db()
    return Allocation.objects.get(job=job, attempt=job.attempt, ended_at__isnull=True).node.name


def started(env: Env, **spec: Any) -> tuple[Job, Any]:
    job = env.submit(simulation={"duration_s": 10_000}, **spec)
    daemon = env.daemon()
    env.run(daemon, seconds=2, cycles=2)
    job.refresh_from_db()
    assert job.state == "running"
    return job, daemon


def test_not_ready_node_is_cordoned_and_its_job_fails_over(env: Env) -> None:
    job, daemon = started(env)
    first = node_of(job)
    env.backend.fail_node(first)
    env.run(daemon)
    node = Node.objects.get(name=first)
    assert (node.ready, node.cordoned, node.cordoned_by) == (False, True, "daemon")
    job.refresh_from_db()
    assert job.attempt == 1 and job.state == "binding"
    assert node_of(job) != first
    assert_consistent(env.backend)
    env.backend.heal_node(first)
    env.run(daemon)
    node.refresh_from_db()
    assert (node.ready, node.cordoned) == (True, False)


def test_sync_fingerprints_only_the_nodes_listed_anew(
    env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unchanged node is listed as the same (frozen) object and keeps its fingerprint; a
    node that changed is a new object, fingerprinted again, and the inventory is written."""
    daemon = env.daemon()
    env.run(daemon)
    taken: list[str] = []
    real = nodes_module._fingerprint

    def counting(info: Any) -> Any:
        taken.append(info.name)
        return real(info)

    monkeypatch.setattr(nodes_module, "_fingerprint", counting)
    assert daemon.sync_nodes() == 0
    assert taken == []
    name = Node.objects.order_by("name").values_list("name", flat=True)[0]
    env.backend.fail_node(name)
    assert daemon.sync_nodes() == 1  # NotReady: written
    assert taken == [name]
    assert Node.objects.get(name=name).ready is False


def test_node_cordoned_by_the_clusters_admins_gets_nothing_new(env: Env) -> None:
    daemon = env.daemon()
    env.run(daemon)  # learn the inventory
    names = sorted(Node.objects.values_list("name", flat=True))
    for name in names[:-1]:  # `kubectl cordon` every node but the last, outside Gantry
        env.backend.set_node_unschedulable(name, True)
    jobs = [env.submit(simulation={"duration_s": 600}) for _ in range(3)]
    env.run(daemon, seconds=1)

    def placed() -> list[str]:
        live = Allocation.objects.filter(job__in=jobs, ended_at__isnull=True)
        return sorted(live.values_list("node__name", flat=True))

    assert placed() == [names[-1], names[-1]]  # two 4-GPU jobs fill the one open node
    assert Node.objects.get(name=names[0]).cordoned is False  # Gantry's own flag untouched
    env.backend.set_node_unschedulable(names[0], False)
    env.run(daemon, seconds=1)
    assert placed() == sorted([names[-1], names[-1], names[0]])
    assert_consistent(env.backend)


def test_admin_fails_and_heals_a_simulated_node_through_the_database(env: Env) -> None:
    job, daemon = started(env)
    first = Node.objects.get(name=node_of(job))
    node_set_failed(user=env.org.users["pat"], node=first, failed=True)
    env.run(daemon, cycles=2)
    assert env.backend.node_failed(first.name)
    job.refresh_from_db()
    assert job.attempt == 1 and node_of(job) != first.name
    node_set_failed(user=env.org.users["pat"], node=first, failed=False)
    env.run(daemon, cycles=2)
    first.refresh_from_db()
    assert not env.backend.node_failed(first.name)
    assert (first.ready, first.cordoned) == (True, False)


def report(node: str, xids: list[int]) -> dict[str, Any]:
    gpu = {"index": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
           "memory_used_mib": 1024, "utilization_pct": 97.0, "temperature_c": 61.0,
           "ecc_uncorrected": 0, "xid_errors": xids, "healthy": True}  # fmt: skip
    return {"node": node, "driver_version": "550.54.15", "gpus": [gpu]}


def test_node_agent_reports_a_fatal_xid_and_the_job_fails_over(env: Env, clients: Any) -> None:
    job, daemon = started(env, resources={"gpus": 8})
    first = node_of(job)
    agent = f.UserFactory(username="agent-h100")
    NodeAgent.objects.create(user=agent, node_name=first)  # its own node's agent
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_authenticate(agent)
    response = client.post("/api/v1/nodes/report/", report(first, [79]), format="json")
    assert response.status_code == 200, response.json()
    gpu = GpuDevice.objects.get(node__name=first, index=0)
    assert (gpu.healthy, gpu.health_reason, gpu.utilization_pct) == (False, "XID 79", 97.0)
    env.run(daemon)
    node = Node.objects.get(name=first)
    assert node.cordoned and node.cordon_reason == "GPU 0 unhealthy"
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("queued", 1)  # until its old pod has really stopped
    env.run(daemon, seconds=3, cycles=2)
    job.refresh_from_db()
    assert job.state in ("binding", "running") and node_of(job) != first
    assert_consistent(env.backend)


@pytest.mark.parametrize(
    ("who", "body", "status"),
    [
        ("alice", "ok", 403),
        ("carol", "ok", 403),
        ("pat", "unknown-node", 404),
        ("pat", "bad", 400),
        ("pat", "ok", 200),
    ],
    ids=["member", "finance", "unknown-node", "bad-body", "platform-admin"],
)
def test_report_permissions_and_validation(
    env: Env, clients: Any, who: str, body: str, status: int
) -> None:
    env.run(env.daemon())
    payload = {"ok": report("h100-0000", []), "unknown-node": report("nope", []),
               "bad": {**report("h100-0000", []), "gpus": [{"index": "x"}]}}[body]  # fmt: skip
    response = clients(who).post("/api/v1/nodes/report/", payload, format="json")
    assert response.status_code == status, response.content


def test_drain_by_platform_admin_moves_jobs_and_others_may_not(env: Env, clients: Any) -> None:
    job, daemon = started(env)
    first = Node.objects.get(name=node_of(job))
    url = f"/api/v1/nodes/{first.pk}/drain/"
    assert clients("alice").post(url, {}, format="json").status_code == 404
    assert clients("tina").post(url, {}, format="json").status_code == 403
    response = clients("pat").post(url, {"reason": "firmware update"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["cordon_reason"] == "firmware update"
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "preempted"
    env.run(daemon, seconds=3, cycles=2)
    job.refresh_from_db()
    assert job.attempt == 1 and job.state in ("binding", "running")
    assert node_of(job) != first.name
    unschedulable = {n.name: n.unschedulable for n in env.backend.list_nodes()}
    assert unschedulable[first.name] is True  # the cordon reached the cluster
    response = clients("pat").post(f"/api/v1/nodes/{first.pk}/uncordon/", {}, format="json")
    assert response.status_code == 200 and response.json()["cordoned"] is False
    env.run(daemon)
    assert not any(n.unschedulable for n in env.backend.list_nodes())
    assert_consistent(env.backend)


def test_node_list_for_admins_only(env: Env, clients: Any) -> None:
    env.run(env.daemon())
    assert clients("alice").get("/api/v1/nodes/").json()["results"] == []
    listed = clients("tina").get("/api/v1/nodes/").json()["results"]
    assert [n["name"] for n in listed] == [f"h100-{i:04d}" for i in range(4)]
    assert len(listed[0]["gpus"]) == 8


def test_database_refuses_to_allocate_a_device_twice(env: Env) -> None:
    job, _ = started(env, resources={"gpus": 1})
    held = AllocationDevice.objects.get(allocation__job=job)
    other = env.submit()
    node = held.allocation.node
    rogue = Allocation.objects.create(job=other, node=node, attempt=0, replica=0, pod_name="rogue",
                                      namespace="x", started_at=timezone.now())  # fmt: skip
    with pytest.raises(IntegrityError), transaction.atomic():
        AllocationDevice.objects.create(allocation=rogue, device=held.device, milli=1)
    AllocationDevice.objects.create(allocation=rogue, device=held.device.node.devices.get(index=7)
                                    if held.device.index != 7 else held.device.node.devices.get(
                                        index=6), milli=500)  # fmt: skip
    AllocationDevice.objects.filter(pk=held.pk).update(released=True)
    held.device.refresh_from_db()
    assert held.device.allocated_milli == 0
