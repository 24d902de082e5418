"""gantry-scheduler-workload-admission (platform/k8s/04-admission.yaml) on a RayJob's submitter
template, on the real API server (issue 37): the daemon's own admission patch, which labels the
submitter template as a companion of replica 0 (scheduler/backends/kubernetes/resume.py), is
allowed; anything else on that template is refused: another label, another image, a template
added where the RayJob has none (the webhook writes KubeRay's default at creation, never the
daemon). And on a TrainJob's runtime patches: the daemon renames the attempt in its own at
each admission, never touching another manager's. The CRDs at their pinned releases; their
operators are not running."""

from __future__ import annotations

import copy
import time
from typing import Any, cast

import pytest

from scheduler.backends.kubernetes.render import LABEL_HELD as HELD
from scheduler.backends.kubernetes.resume import TRAINJOB_MANAGER, resume_patch
from scheduler.backends.workloads import RAYJOB, TRAINJOB
from tests.k8s.builders import make_request
from tests.k8s.rbac_table import SCHEDULER
from tests.k8s.real_api import Answer, json_patch, request
from tests.k8s.test_rbac_real import PROBE, Accounts, _refused_by_policy, accounts, policies

__all__ = ["accounts", "policies"]  # the fixtures, for this module
POLICY = "gantry-scheduler-workload-admission"
SUBMITTER = "/spec/submitterPodTemplate"


def _rayjob(name: str, submitter: bool) -> dict[str, Any]:
    """A RayJob as Gantry's webhook holds it: suspended, labelled held, with KubeRay's default
    submitter written out (`submitter`) or, as one created before the webhook wrote it, none."""
    spec = copy.deepcopy(cast(dict[str, Any], PROBE["spec"]))
    cluster = {"headGroupSpec": {"template": {"spec": spec}}, "workerGroupSpecs": []}
    body: dict[str, Any] = {"suspend": True, "entrypoint": "python x.py", "rayClusterSpec": cluster}
    if submitter:
        container = {
            "name": "ray-job-submitter",
            "image": spec["containers"][0]["image"],
            "resources": {"requests": {"cpu": "500m", "memory": "200Mi"}},
        }
        body["submitterPodTemplate"] = {
            "spec": {"restartPolicy": "Never", "containers": [container]}
        }
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": name, "labels": {HELD: "true"}},
        "spec": body,
    }


@pytest.mark.kubernetes
@pytest.mark.parametrize("submitter", [True, False], ids=["default-written", "none"])
def test_the_scheduler_labels_a_rayjobs_submitter_template_and_nothing_more(
    accounts: Accounts, policies: None, submitter: bool
) -> None:
    scheduler = accounts.clients[SCHEDULER]
    path = f"/apis/ray.io/v1/namespaces/{accounts.project}/rayjobs"
    name = f"rbac-rayjob-{'sub' if submitter else 'none'}"
    made = request(accounts.api, "POST", path, body=_rayjob(name, submitter))
    assert made.status == 201, made.message
    try:

        def patch(ops: list[dict[str, Any]]) -> Answer:
            return json_patch(scheduler, f"{path}/{name}", ops)

        admit = resume_patch(RAYJOB, made.body, make_request(job_id=8))
        assert any(op["path"].startswith(SUBMITTER) for op in admit) is submitter, admit
        # The policy is in effect once the API server's informer has this version of it
        # (`policies` waits for another policy only): a user's label on the head refused.
        head = "/spec/rayClusterSpec/headGroupSpec/template/metadata"
        foreign = [{"op": "add", "path": head, "value": {"labels": {"t": "x"}}}]
        deadline = time.monotonic() + 30.0
        while patch(foreign).status != 403 or patch(admit).status != 200:
            assert time.monotonic() < deadline, "the workload admission policy never applied"
            time.sleep(0.2)
        answer = patch(admit)
        assert answer.status == 200, answer.message
        if not submitter:
            probe: dict[str, Any] = _rayjob(name, submitter=False)["spec"]["rayClusterSpec"]
            container = probe["headGroupSpec"]["template"]["spec"]["containers"][0]
            template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
            _refused_by_policy(patch([{"op": "add", "path": SUBMITTER, "value": template}]), POLICY)
            return
        labels = answer.body["spec"]["submitterPodTemplate"]["metadata"]["labels"]
        assert labels["gantry.io/companion"] == "submitter"
        theirs = [{"op": "add", "path": f"{SUBMITTER}/metadata", "value": {"labels": {"t": "x"}}}]
        _refused_by_policy(patch(theirs), POLICY)
        image = [
            {"op": "replace", "path": f"{SUBMITTER}/spec/containers/0/image", "value": "evil:1"}
        ]
        _refused_by_policy(patch(image), POLICY)
        gone = [{"op": "remove", "path": SUBMITTER}]
        _refused_by_policy(patch(gone), POLICY)
    finally:
        request(accounts.api, "DELETE", f"{path}/{name}")


def _trainjob(name: str) -> dict[str, Any]:
    """A TrainJob as Gantry's webhook holds it: suspended, labelled held, with a runtime patch
    of another manager's (Kueue's, say) beside which Gantry's goes."""
    theirs = {
        "manager": "kueue.x-k8s.io/manager",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {"template": {"metadata": {"labels": {"team": "a"}}}}
                            },
                        }
                    ]
                }
            }
        },
    }
    trainer = {"numNodes": 1, "image": "gantry:0.1.0"}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {HELD: "true"}},
        "spec": {
            "suspend": True,
            "runtimeRef": {"name": "torch"},
            "trainer": trainer,
            "runtimePatches": [theirs],
        },
    }


@pytest.mark.kubernetes
def test_the_scheduler_renames_the_attempt_in_its_own_trainjob_runtime_patch_only(
    accounts: Accounts, policies: None
) -> None:
    """Admitted, preempted (suspended) and admitted again: the daemon's second admission
    replaces the attempt its runtime patch names on the initializers' labels (so an older
    attempt's initializer is never kept), which the policy allows; another manager's patch
    stays as it was (changed or removed: refused)."""
    scheduler = accounts.clients[SCHEDULER]
    path = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{accounts.project}/trainjobs"
    name = "rbac-trainjob-attempt"
    made = request(accounts.api, "POST", path, body=_trainjob(name))
    assert made.status == 201, made.message
    try:

        def patch(ops: list[dict[str, Any]], dry_run: bool = True) -> Answer:
            return json_patch(scheduler, f"{path}/{name}", ops, dry_run=dry_run)

        first = resume_patch(TRAINJOB, made.body, make_request(job_id=8))
        foreign = [{"op": "add", "path": "/metadata/labels/team", "value": "x"}]
        deadline = time.monotonic() + 30.0
        while (refused := patch(foreign)).status != 403 or (ok := patch(first)).status != 200:
            assert time.monotonic() < deadline, (
                f"the workload admission policy never applied: {refused.status} "
                f"{refused.message}; {patch(first).status} {patch(first).message}"
            )
            time.sleep(0.2)
        assert ok.status == 200
        admitted = patch(first, dry_run=False)
        assert admitted.status == 200, admitted.message
        suspended = patch([{"op": "replace", "path": "/spec/suspend", "value": True}], False)
        assert suspended.status == 200, suspended.message
        again = resume_patch(TRAINJOB, suspended.body, make_request(job_id=8, attempt=1))
        renamed = [op for op in again if op["path"] != "/spec/suspend"]
        assert len(renamed) == 2 and {op["value"] for op in renamed} == {"1"}, again
        answer = patch(again)
        assert answer.status == 200, answer.message
        (ours,) = [
            p for p in answer.body["spec"]["runtimePatches"] if p["manager"] == TRAINJOB_MANAGER
        ]
        jobs = ours["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
        attempts = {
            j["name"]: j["template"]["spec"]["template"]["metadata"]["labels"].get(
                "gantry.io/attempt"
            )
            for j in jobs
        }
        assert attempts == {"node": None, "dataset-initializer": "1", "model-initializer": "1"}
        template = "/spec/runtimePatches/0/trainingRuntimeSpec/template/spec/replicatedJobs/0"
        label = f"{template}/template/spec/template/metadata/labels/team"
        _refused_by_policy(patch([{"op": "replace", "path": label, "value": "b"}]), POLICY)
        _refused_by_policy(patch([{"op": "remove", "path": "/spec/runtimePatches/0"}]), POLICY)
    finally:
        request(accounts.api, "DELETE", f"{path}/{name}")


@pytest.mark.kubernetes
def test_the_scheduler_labels_a_cpu_head_a_companion_beside_gpu_workers(
    accounts: Accounts, policies: None
) -> None:
    """A RayJob whose head asks for no GPUs beside a GPU worker group: the daemon's admission
    labels the head's template a companion of replica 0 (`gantry.io/companion: head`, with
    the job and the attempt), which the policy allows as Gantry's labels."""
    scheduler = accounts.clients[SCHEDULER]
    path = f"/apis/ray.io/v1/namespaces/{accounts.project}/rayjobs"
    name = "rbac-rayjob-cpu-head"
    body = _rayjob(name, submitter=True)
    worker = copy.deepcopy(body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"])
    worker["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "8"}}
    group = {"groupName": "gpu", "replicas": 2, "minReplicas": 2, "maxReplicas": 2}
    body["spec"]["rayClusterSpec"]["workerGroupSpecs"] = [{**group, "template": worker}]
    made = request(accounts.api, "POST", path, body=body)
    assert made.status == 201, made.message
    try:
        admit = resume_patch(RAYJOB, made.body, make_request(job_id=8))
        deadline = time.monotonic() + 30.0
        while True:
            answer = json_patch(scheduler, f"{path}/{name}", admit)
            if answer.status == 200:
                break
            assert time.monotonic() < deadline, f"never allowed: {answer.message}"
            time.sleep(0.2)
        cluster = answer.body["spec"]["rayClusterSpec"]
        head = cluster["headGroupSpec"]["template"]["metadata"]["labels"]
        worker_labels = cluster["workerGroupSpecs"][0]["template"]["metadata"]["labels"]
        assert (head["gantry.io/companion"], head["gantry.io/attempt"]) == ("head", "0")
        assert "gantry.io/companion" not in worker_labels
    finally:
        request(accounts.api, "DELETE", f"{path}/{name}")
