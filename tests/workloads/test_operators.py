"""The operators misbehaving as the real ones do (issue 37), over the fake API server with the
daemon on a fake clock: KubeRay's RayCluster controller making its pods again while its RayJob
is being suspended (and so after Gantry deleted them as orphans), an operator slow to make its
pods once resumed, an operator that keeps its pods running for a while after `suspend: true`.

`KubeRay` plays both of KubeRay's controllers as they behave: the RayJob's makes a RayCluster
(`<name>-c<n>`) once resumed, only after the last one is gone, and deletes it once suspended;
the RayCluster's makes the cluster's missing pods again for as long as the cluster lives, so
pods deleted while it is being torn down come back, under new names."""

from __future__ import annotations

import copy
from typing import Any

from scheduler.jobs.services import job_submit
from scheduler.models import Allocation, Job
from scheduler.workloads.kinds import RAYJOB
from tests.conftest import job_spec
from tests.workloads.test_controller import World, cancel_and_readmit, preempt_running, world
from tests.workloads.test_kinds_queued import Operator, rayjob

__all__ = ["world"]  # the fixture, for this module
Obj = dict[str, Any]


class KubeRay(Operator):
    """KubeRay, with the number of passes its RayCluster controller remakes pods after the
    RayJob was suspended (`remakes`) and passes it ignores `suspend: true` (`ignores`), and
    the passes after a resume before it makes its pods (`slow`), one pod per pass."""

    def __init__(self, world: World, *, remakes: int = 0, ignores: int = 0, slow: int = 0) -> None:
        super().__init__(world, RAYJOB)
        self.remakes, self.ignores, self.slow = remakes, ignores, slow
        self.cluster = 0  # the live RayCluster's number; 0: none
        self.made = 0  # RayClusters made
        self.remade: list[str] = []  # pods made again while suspending
        self._left = 0  # passes left for the cluster being torn down
        self._waited = 0  # passes waited since a resume
        self._serial = 0  # pod names: the operator's generateName
        self._templates: Obj = {}

    def step(self, name: str) -> list[str]:
        obj = self.get(name)
        if obj["spec"]["suspend"] or self._left:
            # KubeRay's Suspending: the cluster is torn down whatever the flag says since
            self._waited = 0
            return self._suspended(name)
        if not self.cluster:
            if self._waited < self.slow:
                self._waited += 1
                return self.pods(name)
            self.made += 1
            self.cluster = self.made
            # A RayCluster holds the templates the RayJob had when it was made.
            self._templates = copy.deepcopy(obj)
        self._make_missing(name, limit=1 if self.slow else None)
        return self.pods(name)

    def _suspended(self, name: str) -> list[str]:
        if not self.cluster:
            return self.pods(name)
        if self.ignores:  # the operator has not seen the suspension yet
            self.ignores -= 1
            return self.pods(name)
        if self._left == 0 and self.remakes:
            self._left = self.remakes + 1
        if self._left > 1:
            # 1. the RayJob's controller deletes the cluster's pods; 2. the RayCluster's,
            # not yet told its cluster is going, makes the missing ones again
            self._left -= 1
            for pod in self.pods(name):
                self.world.fake.delete("pods", self.world.namespace, pod, 0)
            self.remade += self._make_missing(name)
            return self.pods(name)
        self._left = 0
        for pod in self.pods(name):  # the cluster deleted: its pods with it
            self.world.fake.delete("pods", self.world.namespace, pod, 0)
        self.cluster = 0
        return []

    def _make_missing(self, name: str, limit: int | None = None) -> list[str]:
        """Make the live cluster's missing pods (at most `limit`), from the templates the
        RayJob had when the cluster was made: the names made."""
        have = {
            p["metadata"]["labels"].get("test/member")
            for p in self.world.fake.list_objects("pods", self.world.namespace, {})["items"]
            if p["metadata"]["labels"].get("test/owner") == name
        }
        made: list[str] = []
        for member, template, labels in self._members(self._templates):
            if member in have or (limit is not None and len(made) >= limit):
                continue
            self._serial += 1
            pod_name = f"{name}-c{self.cluster}-{member}-{self._serial}"
            meta = {
                "name": pod_name,
                "labels": {
                    **template.get("metadata", {}).get("labels", {}),
                    **labels,
                    "ray.io/cluster": f"{name}-c{self.cluster}",
                    "test/owner": name,
                    "test/member": member,
                },
            }
            body = {"metadata": meta, "spec": copy.deepcopy(template["spec"])}
            self.world.fake.create("pods", self.world.namespace, body)
            made.append(pod_name)
        return made

    def _members(self, obj: Obj) -> list[tuple[str, Obj, dict[str, str]]]:
        cluster = obj["spec"]["rayClusterSpec"]
        head = ("head", cluster["headGroupSpec"]["template"], {"ray.io/node-type": "head"})
        workers = [
            (
                f"{g['groupName']}-{i}",
                g["template"],
                {"ray.io/node-type": "worker", "ray.io/group": g["groupName"]},
            )
            for g in cluster["workerGroupSpecs"]
            for i in range(g["replicas"])
        ]
        return [head, *workers]


def low_rayjob(world: World, kuberay: KubeRay) -> Job:
    labels = {"gantry.io/priority-class": "low"}
    kuberay.create(rayjob("low", **labels))
    world.step()
    return Job.objects.get(spec__workload__kind="RayJob")


def node_of(world: World, pod: str) -> str | None:
    found = world.pod(pod)
    assert found is not None, pod
    return found["spec"].get("nodeName")


def bound_pods(world: World, name: str, operator: Operator) -> dict[str, str]:
    return {n: node for n in operator.pods(name) if (node := node_of(world, n))}


def test_a_preempted_rayjob_whose_cluster_remakes_its_pods_ends_suspended_without_pods(
    world: World,
) -> None:
    """KubeRay makes the cluster's pods again for three passes after the suspension: none is
    bound, the RayJob stays suspended while the preemptor holds the GPUs, and once the cluster
    is gone no pod of it is left."""
    kuberay = KubeRay(world, remakes=3)
    low = low_rayjob(world, kuberay)
    high = preempt_running(world, low, kuberay.step)
    assert kuberay.remade, "the operator made no pod again: the test tests nothing"
    for _ in range(4):
        world.step()
        assert not bound_pods(world, "low", kuberay)
        kuberay.step("low")
    assert kuberay.get("low")["spec"]["suspend"] is True
    assert kuberay.pods("low") == []
    low.refresh_from_db()
    assert (low.state, low.attempt) == ("queued", 1), low.reason
    assert not Allocation.objects.filter(job=low, ended_at__isnull=True).exists()
    high.refresh_from_db()
    assert high.state in ("binding", "running"), high.reason


def test_the_pods_of_a_torn_down_cluster_are_never_admitted_as_a_new_attempts(
    world: World,
) -> None:
    """The preemptor ends while KubeRay still makes the old cluster's pods again: the RayJob
    is admitted again, and its new attempt takes only the new cluster's pods (those of the old
    one are deleted as orphans), which run."""
    kuberay = KubeRay(world, remakes=6)
    low = low_rayjob(world, kuberay)
    high = preempt_running(world, low, kuberay.step)
    cancel_and_readmit(world, high, kuberay.step)
    for _ in range(8):
        world.step()
        kuberay.step("low")
    low.refresh_from_db()
    assert low.attempt == 1 and kuberay.made == 2, (low.state, low.reason, kuberay.made)
    names = {a.pod_name for a in Allocation.objects.filter(job=low, attempt=1)}
    assert names and all(n.startswith("low-c2-") for n in names), names
    assert set(kuberay.pods("low")) == names
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    low.refresh_from_db()
    assert (low.state, low.attempt) == ("running", 1), low.reason


def test_an_operator_slow_to_make_its_pods_is_waited_for_not_requeued(world: World) -> None:
    """KubeRay makes the cluster's pods one per pass, starting three passes after the resume
    (40 s apart: 3 min in all, within the binding deadline): the job's one admission binds
    them as they come, and it runs, never requeued."""
    kuberay = KubeRay(world, slow=3)
    kuberay.create(rayjob("slow", workers=1))
    world.step()
    job = Job.objects.get(spec__workload__kind="RayJob")
    assert kuberay.get("slow")["spec"]["suspend"] is False
    for _ in range(5):
        kuberay.step("slow")
        world.step(40.0)
    job.refresh_from_db()
    assert (job.state, job.attempt) in (("admitted", 0), ("binding", 0)), job.reason
    names = kuberay.pods("slow")
    assert len(names) == 2 and len(bound_pods(world, "slow", kuberay)) == 2
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("running", 0), job.reason


def test_an_operator_that_ignores_suspend_for_a_while_holds_the_gpus_until_its_pods_go(
    world: World,
) -> None:
    """KubeRay keeps the preempted cluster running for five passes: the preemptor is not
    bound onto GPUs its pods still hold, the RayJob stays suspended, and once the pods go
    the preemptor runs and the RayJob waits queued."""
    kuberay = KubeRay(world, ignores=5)
    low = low_rayjob(world, kuberay)
    names = kuberay.step("low")
    for name in names:
        world.fake.run_container(world.namespace, name)
    world.step()
    world.step(400.0)  # past the minimum runtime
    spec = job_spec(replicas=1, resources={"gpus": 8}, priority_class="high", max_runtime_s=60)
    high, _ = job_submit(user=world.org.users["alice"], project=world.org.proj_alpha, payload=spec)
    held: list[bool] = []
    for _ in range(5):
        world.step()
        kuberay.step("low")
        held.append(kuberay.ignores > 0)
        if kuberay.ignores:
            assert set(kuberay.pods("low")) == set(names)  # still running, ignoring it
            assert kuberay.get("low")["spec"]["suspend"] is True
            high.refresh_from_db()
            assert not world.pod(f"gantry-{high.pk}-a0-r0"), high.state
    assert any(held)
    for _ in range(4):
        world.step()
        kuberay.step("low")
    high.refresh_from_db()
    low.refresh_from_db()
    assert high.state in ("binding", "running"), high.reason
    assert node_of(world, f"gantry-{high.pk}-a0-r0")
    assert (low.state, low.attempt) == ("queued", 1), low.reason
    assert kuberay.get("low")["spec"]["suspend"] is True and kuberay.pods("low") == []
