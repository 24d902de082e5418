"""`kubectl get` shows why a workload waits (issue 37): the workload controller keeps Gantry's
status annotations (`gantry.io/status`, `gantry.io/reason`) current on each object it queues,
with the event of each change. Over the fake API server, the daemon on a fake clock."""

from __future__ import annotations

from typing import Any

from scheduler.workloads.status import ANNOTATION_REASON, ANNOTATION_STATUS
from tests.workloads.test_controller import (
    JobController,
    World,
    create_job,
    job,
    mirrored,
    pod,
    world,
)

__all__ = ["world"]  # the fixture, shared with test_controller

Obj = dict[str, Any]


def status(obj: Obj | None) -> tuple[str, str]:
    assert obj is not None
    annotations = obj["metadata"].get("annotations") or {}
    return annotations.get(ANNOTATION_STATUS, ""), annotations.get(ANNOTATION_REASON, "")


def test_a_waiting_pod_says_why_on_itself_and_the_status_follows_its_job(world: World) -> None:
    """Two 8-GPU nodes and 16 GPUs of quota for team A: the third 8-GPU pod waits, and the
    pod itself says it is queued and why; the others say they run."""
    for name in ("a", "b", "c"):
        world.create(pod(name, gpus=8))
    world.step()
    world.step()
    world.controller.sync()
    waiting = next(n for n in ("a", "b", "c") if not world.pod(n)["spec"].get("nodeName"))
    word, why = status(world.pod(waiting))
    assert word == "Queued"
    assert f"Gantry job {mirrored(waiting).pk}" in why and "queued" in why
    assert mirrored(waiting).reason.rstrip(".") in why
    placed = [n for n in ("a", "b", "c") if n != waiting]
    assert {status(world.pod(n))[0] for n in placed} == {"Admitted"}
    for name in placed:
        world.fake.run_container(world.namespace, name)
    world.step()
    world.controller.sync()
    assert {status(world.pod(n))[0] for n in placed} == {"Running"}
    assert status(world.pod(waiting))[0] == "Queued", "unchanged: not written again"


def test_a_job_carries_its_status_through_its_life(world: World) -> None:
    create_job(world, job("train", parallelism=2))
    world.controller.sync()
    assert status(world.fake.get("jobs", world.namespace, "train"))[0] == "Queued"
    world.step()
    names = JobController(world).step("train")
    world.step()
    world.controller.sync()
    assert status(world.fake.get("jobs", world.namespace, "train"))[0] == "Admitted"
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    world.controller.sync()
    word, why = status(world.fake.get("jobs", world.namespace, "train"))
    assert (word, why.endswith("is running.")) == ("Running", True)
    for name in names:
        assert status(world.pod(name)) == ("", ""), "a Job's status is on the Job, not its pods"


def test_a_refused_object_says_why_on_itself(world: World) -> None:
    create_job(world, job("queue", parallelism=2, completions=10))
    world.controller.sync()
    word, why = status(world.fake.get("jobs", world.namespace, "queue"))
    assert word == "Refused" and "completions must equal parallelism" in why
    world.create(pod("stranger"), user="mallory")
    world.controller.sync()
    word, why = status(world.pod("stranger"))
    assert word == "Refused" and "'mallory'" in why


def test_the_status_patch_changes_nothing_else(world: World) -> None:
    create_job(world, job("only", parallelism=1))
    before = world.fake.get("jobs", world.namespace, "only")
    world.controller.sync()
    after = world.fake.get("jobs", world.namespace, "only")
    assert after["spec"] == before["spec"]
    assert after["metadata"]["labels"] == before["metadata"]["labels"]
    kept = {
        k: v
        for k, v in after["metadata"]["annotations"].items()
        if k not in (ANNOTATION_STATUS, ANNOTATION_REASON)
    }
    assert kept == before["metadata"]["annotations"]
