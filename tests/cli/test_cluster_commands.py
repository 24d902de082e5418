"""`gantry queue`, `gantry usage` and `gantry nodes` against a live server (issue 20)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.utils import timezone

from scheduler.models import GpuDevice, JobState, XidEvent
from tests import factories as f
from tests.conftest import Org
from tests.eta_builders import small_queue

pytestmark = pytest.mark.django_db(transaction=True)


def test_queue_shows_position_reason_and_estimate(gantry: Any, org: Org) -> None:
    queue = small_queue(org, timezone.now())
    code, out, err = gantry("alice", "queue")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "STATE", "PROJECT"]
    first = next(line for line in lines if line.startswith(str(queue.first.pk)))
    assert "1 in team, 2 in cluster" in first and "in about" in first
    second = next(line for line in lines if line.startswith(str(queue.second.pk)))
    assert "2 in team, 3 in cluster" in second and "reservation" in second
    assert "bravo" not in out and f"job {queue.bravo.pk}" not in out
    code, out, _ = gantry("alice", "--json", "queue")
    assert [job["id"] for job in json.loads(out)] == [queue.first.pk, queue.second.pk]


def test_queue_of_a_user_with_nothing_waiting(gantry: Any, org: Org) -> None:
    code, out, _ = gantry("chris", "queue")
    assert (code, out) == (0, "(none)\n")


def test_usage_shows_in_use_against_guarantee_and_limit(gantry: Any, org: Org) -> None:
    job = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING, replicas=2)
    f.place(job)
    code, out, err = gantry("alice", "usage")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.split() == ["TENANT", "FLAVOR", "IN_USE", "GUARANTEED", "LIMIT", "BORROWING"]
    assert row.split() == ["team-alpha", "H100-80GB", "2", "16", "32"]
    code, out, _ = gantry("alice", "--json", "usage")
    assert json.loads(out)[0]["used_milli"] == 2000


def test_usage_shows_a_model_held_without_a_quota(gantry: Any, org: Org) -> None:
    f.FlavorFactory(name="T4-16GB")
    job = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING)
    f.place(job, f.NodeFactory(flavor="T4-16GB"))
    code, out, err = gantry("alice", "usage")
    assert code == 0, err
    t4 = next(line for line in out.splitlines() if "T4-16GB" in line)
    assert t4.split() == ["team-alpha", "T4-16GB", "1", "0", "none", "yes", "(no", "quota)"]


def test_usage_of_a_foreign_tenant_is_not_found(gantry: Any, org: Org) -> None:
    code, _, err = gantry("alice", "usage", "--tenant", str(org.bravo.pk))
    assert code == 1 and "HTTP 404" in err


def test_nodes_for_platform_admins(gantry: Any, org: Org) -> None:
    node = f.NodeFactory(name="gpu-a", pool="spot")
    for index in range(2):
        GpuDevice.objects.create(node=node, index=index, model="H100-80GB", memory_mib=81920)
    GpuDevice.objects.filter(node=node, index=1).update(healthy=False)
    XidEvent.objects.create(node=node, device=node.devices.get(index=1), code=79, fatal=True,
                            seen_at=timezone.now())  # fmt: skip
    f.NodeFactory(name="gpu-b", cordoned=True, drain_requested=True)
    code, out, err = gantry("pat", "nodes")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "spot" in rows["gpu-a"] and "1 GPU(s) unhealthy" in rows["gpu-a"]
    assert "XIDS_24H" in out.splitlines()[0]
    assert rows["gpu-a"].split()[-1] == "1" and rows["gpu-b"].split()[-1] == "0"
    assert "1/2" in rows["gpu-a"] and "draining" in rows["gpu-b"]
    code, out, _ = gantry("pat", "nodes", "--pool", "spot")
    assert "gpu-a" in out and "gpu-b" not in out
    code, out, _ = gantry("pat", "--json", "nodes")
    assert {n["name"] for n in json.loads(out)} == {"gpu-a", "gpu-b"}


@pytest.mark.parametrize("persona", ["alice", "tina", "carol"])
def test_nodes_refused_to_everyone_else_like_other_auth_failures(
    gantry: Any, org: Org, persona: str
) -> None:
    f.NodeFactory(name="gpu-a")
    code, out, err = gantry(persona, "nodes")
    assert code == 1 and out == ""
    assert "HTTP 403" in err and "platform admins" in err
