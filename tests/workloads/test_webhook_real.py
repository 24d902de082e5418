"""The admission webhook registered with a real API server (issue 37).

The webhook runs here, on loopback, over TLS with a CA of its own; the configuration that
platform/k8s/24-webhook.yaml ships (registration.py) points at it by URL. Objects are then
created with the client as `kubectl apply` would create them, by a user the API server
authenticates (impersonated by the admin), and read back as stored.

Each configuration here also requires a label of this run on the namespace, so that the other
real-cluster tests sharing the plane (and KUBECONFIG's cluster) never meet it.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from devcluster import crds
from scheduler.workloads import kinds, registration
from scheduler.workloads.kinds import at
from scheduler.workloads.mutate import ANNOTATION_SUBMITTED_BY, GATE, LABEL_MANAGED
from scheduler.workloads.server import WebhookServer
from tests.k8s.real_api import Answer, request
from tests.k8s.real_plane import WAIT_S, RealPlane
from tests.workloads.builders import job_template, pod_spec, template
from tests.workloads.tls import ServingPair, serving_pair

pytestmark = pytest.mark.kubernetes

Obj = dict[str, Any]
USER = "alice@example.com"
ADMIN = "gantry-admin"  # the admin's client certificate (devcluster.certs)
MANAGED = {"app.kubernetes.io/managed-by": "gantry"}


@dataclass
class World:
    api: client.ApiClient  # the admin
    alice: client.ApiClient  # the admin, impersonating alice
    pair: ServingPair
    run: str  # this run's namespace label value
    managed: str
    unmanaged: str

    def create(self, path: str, body: Obj, *, as_alice: bool = True) -> Answer:
        return request(self.alice if as_alice else self.api, "POST", path, body=body)


def _ca_bundle(pair: ServingPair) -> str:
    return base64.b64encode(pair.ca.read_bytes()).decode()


def _register(api: client.ApiClient, pair: ServingPair, port: int, run: str, name: str) -> None:
    """The shipped configuration, by URL, narrowed to this run's namespaces."""
    url = f"https://127.0.0.1:{port}{registration.PATH}"
    config = registration.configuration(registration.url_client(url, _ca_bundle(pair)), name=name)
    config["webhooks"][0]["namespaceSelector"]["matchLabels"]["gantry.io/test-run"] = run
    answer = request(
        api,
        "POST",
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
        body=config,
    )
    assert answer.status == 201, answer.body


def _unregister(api: client.ApiClient, name: str) -> None:
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    request(api, "DELETE", path)


def _namespace(api: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    answer = request(
        api, "POST", "/api/v1/namespaces", body={"metadata": {"name": name, "labels": labels}}
    )
    assert answer.status == 201, answer.body
    # alice may edit there, as a project member would.
    binding = {
        "metadata": {"name": "alice-edits"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{name}/rolebindings"
    assert request(api, "POST", path, body=binding).status == 201
    for group, plural in (("batch", "jobs"), ("", "pods")):
        _wait_until_allowed(api, name, group, plural)


def _pod(name: str, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {**pod_spec(), **spec},
    }


def _job(name: str) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {"template": template()},
    }


def _gated(answer: Answer) -> bool:
    gates = (answer.body.get("spec") or {}).get("schedulingGates") or []
    return {"name": GATE} in gates


def _wait_until_called(world: World, namespace: str) -> None:
    """The API server reads webhook configurations through its informer: a new one takes
    effect a moment after it is created. Dry runs until it has (they keep nothing)."""
    import time

    deadline = time.monotonic() + WAIT_S
    path = f"/api/v1/namespaces/{namespace}/pods"
    while True:
        answer = request(world.api, "POST", path, body=_pod("probe"), query=[("dryRun", "All")])
        if _gated(answer):
            return
        assert time.monotonic() < deadline, (
            f"the webhook is never called: {answer.status} {answer.body}"
        )
        time.sleep(0.1)


@pytest.fixture(scope="module")
def world(real_plane: RealPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    if real_plane.plane is None:
        pytest.skip(
            "KUBECONFIG's cluster: its API server cannot call a webhook on this machine's loopback"
        )
    pair = serving_pair(tmp_path_factory.mktemp("webhook-pki"))
    server = WebhookServer(("127.0.0.1", 0), pair.cert, pair.key)
    server.start()
    run = uuid.uuid4().hex[:8]
    name = f"gantry-workloads-{run}"
    alice = client.ApiClient(
        real_plane.api.configuration, header_name="Impersonate-User", header_value=USER
    )
    w = World(real_plane.api, alice, pair, run, f"wl-managed-{run}", f"wl-other-{run}")
    try:
        _namespace(w.api, w.managed, {**MANAGED, "gantry.io/test-run": run})
        _namespace(w.api, w.unmanaged, {"gantry.io/test-run": run})
        _register(w.api, pair, server.port, run, name)
        _wait_until_called(w, w.managed)
        yield w
    finally:
        _unregister(w.api, name)
        server.stop()
        for namespace in (w.managed, w.unmanaged):
            request(w.api, "DELETE", f"/api/v1/namespaces/{namespace}")
        alice.close()


def test_a_job_is_stored_suspended_for_gantry_naming_its_creator(world: World) -> None:
    job = _job("train")
    job["metadata"]["annotations"] = {ANNOTATION_SUBMITTED_BY: "the-ceo"}
    job["metadata"]["labels"] = {"gantry.io/priority-class": "high"}
    answer = world.create(f"/apis/batch/v1/namespaces/{world.managed}/jobs", job)

    assert answer.status == 201, answer.body
    stored = answer.body
    assert stored["spec"]["suspend"] is True
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "gantry"
    assert stored["metadata"]["annotations"][ANNOTATION_SUBMITTED_BY] == USER
    assert stored["metadata"]["labels"] == {
        "gantry.io/priority-class": "high",
        LABEL_MANAGED: "true",
    }


def test_a_job_admitted_by_unsuspending_makes_pods_for_gantry_ungated(world: World) -> None:
    """Gantry admits a Job by unsuspending it; the job controller's pods then pass the webhook
    as owned objects: Gantry's schedulerName, no gate (their Job was what was held)."""
    path = f"/apis/batch/v1/namespaces/{world.managed}/jobs"
    assert world.create(path, _job("admitted")).status == 201
    resumed = request(
        world.api,
        "PATCH",
        f"{path}/admitted",
        body={"spec": {"suspend": False}},
        content_type="application/merge-patch+json",
    )
    assert resumed.status == 200, resumed.body

    pod = _first_pod(world, world.managed, "job-name=admitted")
    assert pod["spec"]["schedulerName"] == "gantry"
    assert "schedulingGates" not in pod["spec"]
    assert ANNOTATION_SUBMITTED_BY not in (pod["metadata"].get("annotations") or {})
    assert pod["status"]["phase"] == "Pending"  # no kube-scheduler takes a pod of Gantry's


def _first_pod(world: World, namespace: str, selector: str) -> Obj:
    """The first pod matching `selector`, once the controller has made it."""
    deadline = time.monotonic() + WAIT_S
    while True:
        listed = request(
            world.api,
            "GET",
            f"/api/v1/namespaces/{namespace}/pods",
            query=[("labelSelector", selector)],
        )
        if listed.body.get("items"):
            pod: Obj = listed.body["items"][0]
            return pod
        assert time.monotonic() < deadline, f"no pod {selector} in {namespace}"
        time.sleep(0.1)


def test_a_pod_is_stored_gated(world: World) -> None:
    answer = world.create(f"/api/v1/namespaces/{world.managed}/pods", _pod("single"))

    assert answer.status == 201, answer.body
    stored = answer.body
    assert stored["spec"]["schedulingGates"] == [{"name": GATE}]
    assert stored["spec"]["schedulerName"] == "gantry"
    assert stored["metadata"]["annotations"][ANNOTATION_SUBMITTED_BY] == USER


def test_a_pod_already_placed_by_name_is_refused_by_the_api_server(world: World) -> None:
    """A user's pod with spec.nodeName would skip every scheduler; once gated, the API server
    itself refuses it (a gate and a node name do not go together): nobody runs outside Gantry."""
    answer = world.create(
        f"/api/v1/namespaces/{world.managed}/pods", _pod("placed", nodeName="real-gpu-1")
    )
    assert answer.status == 422, answer.body
    assert "schedulingGates" in answer.message


def test_in_a_namespace_gantry_does_not_manage_nothing_is_touched(world: World) -> None:
    job = world.create(f"/apis/batch/v1/namespaces/{world.unmanaged}/jobs", _job("theirs"))
    pod = world.create(f"/api/v1/namespaces/{world.unmanaged}/pods", _pod("theirs"))

    assert (job.status, pod.status) == (201, 201)
    assert job.body["spec"]["suspend"] is False  # defaulted by the API server, not ours
    assert job.body["spec"]["template"]["spec"]["schedulerName"] == "default-scheduler"
    assert "schedulingGates" not in pod.body["spec"]
    assert pod.body["spec"]["schedulerName"] == "default-scheduler"
    for body in (job.body, pod.body):
        assert ANNOTATION_SUBMITTED_BY not in (body["metadata"].get("annotations") or {})
        assert LABEL_MANAGED not in (body["metadata"].get("labels") or {})


def test_with_the_webhook_down_a_managed_create_is_refused_and_others_go_through(
    world: World, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """failurePolicy Fail (docs/kubernetes-native.md): nothing runs unheld while it is down."""
    run = uuid.uuid4().hex[:8]
    down, other, name = f"wl-down-{run}", f"wl-down-other-{run}", f"gantry-workloads-{run}"
    server = WebhookServer(("127.0.0.1", 0), world.pair.cert, world.pair.key)
    server.start()
    try:
        _namespace(world.api, down, {**MANAGED, "gantry.io/test-run": run})
        _namespace(world.api, other, {"gantry.io/test-run": run})
        _register(world.api, world.pair, server.port, run, name)
        _wait_until_called(world, down)
        server.stop()  # the webhook goes down; its registration stays

        refused = world.create(f"/apis/batch/v1/namespaces/{down}/jobs", _job("while-down"))
        allowed = world.create(f"/apis/batch/v1/namespaces/{other}/jobs", _job("while-down"))

        # What `kubectl apply` prints after "Error from server (InternalError): ...".
        assert refused.status == 500, refused.body
        assert refused.message.startswith(
            'Internal error occurred: failed calling webhook "workloads.gantry.io"'
        ), refused.message
        assert allowed.status == 201, allowed.body
        gone = request(world.api, "GET", f"/apis/batch/v1/namespaces/{down}/jobs/while-down")
        assert gone.status == 404  # nothing was stored
    finally:
        _unregister(world.api, name)
        server.stop()
        for namespace in (down, other):
            request(world.api, "DELETE", f"/api/v1/namespaces/{namespace}")


# -- the CRD kinds (devcluster/crds.py installs them at their pinned releases) -----------------

CRD_OBJECTS: dict[str, Obj] = {
    "JobSet": {"replicatedJobs": [{"name": "w", "replicas": 2, "template": job_template()}]},
    "TrainJob": {"runtimeRef": {"name": "torch-distributed"}},
    "PyTorchJob": {
        "pytorchReplicaSpecs": {
            r: {"replicas": 1, "restartPolicy": "OnFailure", "template": template()}
            for r in ("Master", "Worker")
        }
    },
    "RayJob": {
        "entrypoint": "python -c 'print(1)'",
        "shutdownAfterJobFinishes": True,
        "rayClusterSpec": {
            "headGroupSpec": {"rayStartParams": {}, "template": template()},
            "workerGroupSpecs": [
                {"groupName": "g", "replicas": 1, "rayStartParams": {}, "template": template()}
            ],
        },
    },
    "LeaderWorkerSet": {
        "replicas": 1,
        "leaderWorkerTemplate": {
            "size": 2,
            "leaderTemplate": template(),
            "workerTemplate": template(),
        },
    },
}


@pytest.fixture(scope="module")
def installed(world: World) -> dict[str, crds.Resource]:
    try:
        resources = crds.install(world.api, CRD_OBJECTS)
    except RuntimeError as error:  # no Go toolchain and nothing cached
        pytest.skip(f"the workload kinds' CRDs cannot be fetched: {error}")
    # "edit" does not reach these kinds (their projects' aggregated roles are not installed):
    # alice gets them in the managed namespace, as a cluster admin would grant them.
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{world.managed}"
    groups = sorted({r.group for r in resources.values()})
    role = {
        "metadata": {"name": "alice-workloads"},
        "rules": [{"apiGroups": groups, "resources": ["*"], "verbs": ["*"]}],
    }
    binding = {
        "metadata": {"name": "alice-workloads"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "alice-workloads",
        },
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    }
    assert request(world.api, "POST", f"{rbac}/roles", body=role).status == 201
    assert request(world.api, "POST", f"{rbac}/rolebindings", body=binding).status == 201
    for resource in resources.values():
        _wait_until_allowed(world.api, world.managed, resource.group, resource.plural)
    return resources


def _wait_until_allowed(api: client.ApiClient, namespace: str, group: str, plural: str) -> None:
    """RBAC is read through informers too: a new grant applies a moment after it is made."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": USER,
            "resourceAttributes": {
                "namespace": namespace,
                "verb": "create",
                "group": group,
                "resource": plural,
            },
        },
    }
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    deadline = time.monotonic() + WAIT_S
    while not request(api, "POST", path, body=review).body["status"].get("allowed"):
        assert time.monotonic() < deadline, f"alice never may create {plural}"
        time.sleep(0.1)


@pytest.mark.parametrize("kind_name", list(CRD_OBJECTS))
def test_each_crd_kind_is_stored_held_for_gantry(
    world: World, installed: dict[str, crds.Resource], kind_name: str
) -> None:
    resource = installed[kind_name]
    kind = kinds.find(resource.group, kind_name)
    assert kind is not None and (kind.version, kind.plural) == (resource.version, resource.plural)
    body = {
        "apiVersion": f"{resource.group}/{resource.version}",
        "kind": kind_name,
        "metadata": {"name": kind_name.lower()},
        "spec": CRD_OBJECTS[kind_name],
    }
    path = f"/apis/{resource.group}/{resource.version}/namespaces/{world.managed}/{resource.plural}"
    answer = world.create(path, body)

    assert answer.status == 201, answer.body
    stored = answer.body
    if kind.suspend is not None:
        assert at(stored, kind.suspend) is True
    specs = kind.pod_specs(stored)
    # a RayJob in K8sJobMode without a submitter template gets KubeRay's default one, written
    # out (Gantry labels it at admission, to bind the submitter's pod: issue 37)
    written = 1 if kind is kinds.RAYJOB else 0
    assert len(specs) == len(kind.pod_specs(body)) + written
    if written:
        submitter = stored["spec"]["submitterPodTemplate"]["spec"]["containers"][0]
        assert submitter["name"] == "ray-job-submitter"
        assert submitter["resources"]["requests"] == {"cpu": "500m", "memory": "200Mi"}
    assert all(at(stored, p)["schedulerName"] == "gantry" for p in specs)
    assert stored["metadata"]["annotations"][ANNOTATION_SUBMITTED_BY] == USER
    assert stored["metadata"]["labels"][LABEL_MANAGED] == "true"


# -- held stays held (the ValidatingAdmissionPolicy of 24-webhook.yaml) ------------------------

MANIFEST = Path(__file__).resolve().parents[2] / "platform" / "k8s" / "24-webhook.yaml"
DAEMON = "system:serviceaccount:gantry-system:gantry-scheduler"
POLICIES = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies"
BINDINGS = "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings"


def _shipped(kind: str) -> Obj:
    (doc,) = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d and d["kind"] == kind]
    return dict(doc)


@pytest.fixture(scope="module")
def guarded(world: World) -> Iterator[World]:
    """The shipped policy, the admin standing for Gantry's daemon, bound to this run only."""
    policy = _shipped("ValidatingAdmissionPolicy")
    name = f"{policy['metadata']['name']}-{world.run}"
    policy["metadata"]["name"] = name
    for condition in policy["spec"]["matchConditions"]:
        condition["expression"] = condition["expression"].replace(DAEMON, ADMIN)
    binding = _shipped("ValidatingAdmissionPolicyBinding")
    binding["metadata"]["name"] = name
    binding["spec"]["policyName"] = name
    binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"]["gantry.io/test-run"] = (
        world.run
    )
    try:
        assert request(world.api, "POST", POLICIES, body=policy).status == 201
        assert request(world.api, "POST", BINDINGS, body=binding).status == 201
        _wait_until_guarded(world)
        yield world
    finally:
        request(world.api, "DELETE", f"{BINDINGS}/{name}")
        request(world.api, "DELETE", f"{POLICIES}/{name}")


def _resume(world: World, name: str, *, as_alice: bool = True, dry_run: bool = False) -> Answer:
    return request(
        world.alice if as_alice else world.api,
        "PATCH",
        f"/apis/batch/v1/namespaces/{world.managed}/jobs/{name}",
        body={"spec": {"suspend": False}},
        query=[("dryRun", "All")] if dry_run else [],
        content_type="application/merge-patch+json",
    )


def _wait_until_guarded(world: World) -> None:
    """A new policy and binding take effect a moment after they are made (as a webhook's)."""
    path = f"/apis/batch/v1/namespaces/{world.managed}/jobs"
    assert world.create(path, _job("guard-probe")).status == 201
    deadline = time.monotonic() + WAIT_S
    while _resume(world, "guard-probe", dry_run=True).status == 200:
        assert time.monotonic() < deadline, "the policy never took effect"
        time.sleep(0.1)


def _merge(world: World, path: str, patch: Obj) -> Answer:
    return request(
        world.alice, "PATCH", path, body=patch, content_type="application/merge-patch+json"
    )


def test_a_user_cannot_resume_what_gantry_holds(guarded: World) -> None:
    path = f"/apis/batch/v1/namespaces/{guarded.managed}/jobs"
    assert guarded.create(path, _job("sneaky")).status == 201

    refused = _resume(guarded, "sneaky")

    assert refused.status == 403, refused.body  # the policy's reason: Forbidden
    assert refused.message == (
        f'jobs.batch "sneaky" is forbidden: ValidatingAdmissionPolicy '
        f"'gantry-held-workloads-{guarded.run}' with binding 'gantry-held-workloads-{guarded.run}' "
        "denied request: only Gantry resumes a workload it holds: spec.suspend stays true until "
        "Gantry admits it"
    )
    # Gantry (its daemon's account) may.
    assert _resume(guarded, "sneaky", as_alice=False).status == 200


def test_a_user_cannot_ungate_relabel_or_rename_the_creator(guarded: World) -> None:
    pods = f"/api/v1/namespaces/{guarded.managed}/pods"
    assert guarded.create(pods, _pod("held")).status == 201

    ungated = _merge(guarded, f"{pods}/held", {"spec": {"schedulingGates": None}})
    renamed = _merge(
        guarded, f"{pods}/held", {"metadata": {"annotations": {ANNOTATION_SUBMITTED_BY: "bob"}}}
    )
    unlabelled = _merge(guarded, f"{pods}/held", {"metadata": {"labels": {LABEL_MANAGED: None}}})
    relabelled = _merge(guarded, f"{pods}/held", {"metadata": {"labels": {"team": "nlp"}}})
    spoofed = _merge(
        guarded, f"{pods}/held", {"metadata": {"annotations": {"gantry.io/status": "Running"}}}
    )

    assert ungated.status == 403 and "only Gantry removes" in ungated.message
    assert renamed.status == 403 and "cannot change" in renamed.message
    assert unlabelled.status == 403 and "stays while Gantry holds" in unlabelled.message
    assert spoofed.status == 403 and "only Gantry writes them" in spoofed.message
    assert relabelled.status == 200, relabelled.body  # the rest is the user's


def test_what_gantry_does_not_hold_is_not_guarded(guarded: World) -> None:
    """A Job in a namespace Gantry does not manage is its owner's to resume."""
    path = f"/apis/batch/v1/namespaces/{guarded.unmanaged}/jobs"
    job = _job("free")
    job["spec"]["suspend"] = True
    assert guarded.create(path, job).status == 201
    resumed = request(
        guarded.alice,
        "PATCH",
        f"{path}/free",
        body={"spec": {"suspend": False}},
        content_type="application/merge-patch+json",
    )
    assert resumed.status == 200, resumed.body


@pytest.mark.parametrize("kind_name", [k for k in CRD_OBJECTS if k != "LeaderWorkerSet"])
def test_a_user_cannot_resume_a_held_crd_kind(
    guarded: World, installed: dict[str, crds.Resource], kind_name: str
) -> None:
    resource = installed[kind_name]
    kind = kinds.find(resource.group, kind_name)
    assert kind is not None and kind.suspend is not None
    name = f"resume-{kind_name.lower()}"
    body = {
        "apiVersion": f"{resource.group}/{resource.version}",
        "kind": kind_name,
        "metadata": {"name": name},
        "spec": CRD_OBJECTS[kind_name],
    }
    path = (
        f"/apis/{resource.group}/{resource.version}/namespaces/{guarded.managed}/{resource.plural}"
    )
    assert guarded.create(path, body).status == 201
    resume: Any = False
    for step in reversed(kind.suspend):
        resume = {str(step): resume}

    refused = _merge(guarded, f"{path}/{name}", resume)

    assert refused.status == 403, refused.body
    assert "only Gantry resumes a workload it holds" in refused.message


def test_server_side_apply_creates_held_and_applying_again_keeps_it_held(guarded: World) -> None:
    """`kubectl apply --server-side`: the create is an apply, and the webhook's fields are not
    the applier's, so applying the same manifest again (or a changed one) leaves the Job held
    and is not refused by the policy."""
    path = f"/apis/batch/v1/namespaces/{guarded.managed}/jobs/applied"
    query = [("fieldManager", "kubectl"), ("force", "true")]
    job = _job("applied")

    def apply(body: Obj) -> Answer:
        return request(
            guarded.alice,
            "PATCH",
            path,
            body=body,
            query=query,
            content_type="application/apply-patch+yaml",
        )

    created, again = apply(job), apply(job)
    job["metadata"]["labels"] = {"team": "nlp"}
    changed = apply(job)

    assert (created.status, again.status, changed.status) == (201, 200, 200), changed.body
    assert [a.body["spec"]["suspend"] for a in (created, again, changed)] == [True] * 3
    (owner,) = created.body["metadata"]["managedFields"]
    assert "f:suspend" not in owner["fieldsV1"]["f:spec"]
