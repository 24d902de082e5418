"""The webhook's decision alone: AdmissionReview in, response out (scheduler/workloads/mutate.py).

Each patch is applied with a JSONPatch library, as the API server applies it, and the outcome a
user would `kubectl get` is checked: suspended, Gantry's scheduler on every pod template, the
creating user named, the managed label.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.workloads import kinds
from scheduler.workloads.kinds import at
from scheduler.workloads.mutate import (
    ANNOTATION_SUBMITTED_BY,
    GATE,
    LABEL_MANAGED,
    review_response,
)
from tests.workloads.builders import applied, job_template, obj, ops_of, pod_spec, review, template

pytestmark = pytest.mark.backend_independent(
    "the webhook's pure decision (import-linter): no database, cache or broker"
)

Obj = dict[str, Any]
DAEMON = "system:serviceaccount:gantry-system:gantry-scheduler"


def _job() -> Obj:
    return obj(kinds.JOB, "train", {"template": template()})


def _jobset() -> Obj:
    replicated = [
        {"name": n, "replicas": 1, "template": job_template()} for n in ("driver", "workers")
    ]
    return obj(kinds.JOBSET, "js", {"replicatedJobs": replicated})


def _trainjob() -> Obj:
    return obj(kinds.TRAINJOB, "tj", {"runtimeRef": {"name": "torch-distributed"}})


def _pytorchjob() -> Obj:
    replicas = {n: {"replicas": 1, "template": template()} for n in ("Master", "Worker")}
    return obj(kinds.PYTORCHJOB, "pt", {"pytorchReplicaSpecs": replicas})


def _rayjob() -> Obj:
    cluster = {
        "headGroupSpec": {"rayStartParams": {}, "template": template()},
        "workerGroupSpecs": [
            {"groupName": g, "replicas": 1, "rayStartParams": {}, "template": template()}
            for g in ("small", "large")
        ],
    }
    return obj(kinds.RAYJOB, "ray", {"entrypoint": "python x.py", "rayClusterSpec": cluster})


def _lws() -> Obj:
    templates = {"size": 2, "leaderTemplate": template(), "workerTemplate": template()}
    return obj(kinds.LEADERWORKERSET, "lws", {"replicas": 1, "leaderWorkerTemplate": templates})


def _pod() -> Obj:
    return obj(kinds.POD, "p", pod_spec())


# (kind, builder, where its suspend flag ends up (None: none), its pod specs)
CASES = [
    (kinds.JOB, _job, ("spec", "suspend"), [("spec", "template", "spec")]),
    (
        kinds.JOBSET,
        _jobset,
        ("spec", "suspend"),
        [("spec", "replicatedJobs", i, "template", "spec", "template", "spec") for i in (0, 1)],
    ),
    # A TrainJob holds no pod template: the JobSet its trainer makes gets the scheduler.
    (kinds.TRAINJOB, _trainjob, ("spec", "suspend"), []),
    (
        kinds.PYTORCHJOB,
        _pytorchjob,
        ("spec", "runPolicy", "suspend"),  # runPolicy absent: made
        [("spec", "pytorchReplicaSpecs", n, "template", "spec") for n in ("Master", "Worker")],
    ),
    (
        kinds.RAYJOB,
        _rayjob,
        ("spec", "suspend"),
        [
            ("spec", "rayClusterSpec", "headGroupSpec", "template", "spec"),
            ("spec", "rayClusterSpec", "workerGroupSpecs", 0, "template", "spec"),
            ("spec", "rayClusterSpec", "workerGroupSpecs", 1, "template", "spec"),
            # KubeRay's default submitter, written out (tests/workloads/test_companion_binding.py)
            ("spec", "submitterPodTemplate", "spec"),
        ],
    ),
    (
        kinds.LEADERWORKERSET,
        _lws,
        None,  # no suspend: its pods are gated as they are created
        [
            ("spec", "leaderWorkerTemplate", "leaderTemplate", "spec"),
            ("spec", "leaderWorkerTemplate", "workerTemplate", "spec"),
        ],
    ),
]


@pytest.mark.parametrize(
    ("kind", "build", "suspend", "specs"), CASES, ids=lambda c: getattr(c, "kind", None)
)
def test_each_kind_is_held_and_given_to_gantry(
    kind: kinds.Kind, build: Any, suspend: tuple[Any, ...] | None, specs: list[tuple[Any, ...]]
) -> None:
    body = build()
    stored = applied(review_response(review(kind, body, user="alice@example.com")), body)

    if suspend is not None:
        assert at(stored, suspend) is True
    else:
        assert "suspend" not in stored["spec"]
    assert kind.pod_specs(stored) == specs
    for path in specs:
        assert at(stored, path)["schedulerName"] == "gantry", path
        if path[:2] == ("spec", "submitterPodTemplate"):
            continue  # written by the webhook: no user's containers to keep
        assert at(stored, path)["containers"] == pod_spec()["containers"]  # nothing else moved
    assert stored["metadata"]["annotations"] == {ANNOTATION_SUBMITTED_BY: "alice@example.com"}
    assert stored["metadata"]["labels"] == {LABEL_MANAGED: "true"}


def test_a_jobset_with_a_replicated_job_added_later_is_listed_by_its_kind() -> None:
    body = _jobset()
    body["spec"]["replicatedJobs"].append(
        {"name": "eval", "replicas": 1, "template": job_template()}
    )
    stored = applied(review_response(review(kinds.JOBSET, body)), body)
    assert [at(stored, p)["schedulerName"] for p in kinds.JOBSET.pod_specs(stored)] == [
        "gantry"
    ] * 3


def test_a_users_own_submitted_by_is_overwritten_and_their_priority_class_kept() -> None:
    body = _job()
    body["metadata"]["annotations"] = {ANNOTATION_SUBMITTED_BY: "the-ceo", "note": "mine"}
    body["metadata"]["labels"] = {"gantry.io/priority-class": "high", "team": "nlp"}
    body["spec"]["suspend"] = False  # asked to run at once: held all the same
    body["spec"]["template"]["spec"]["schedulerName"] = "default-scheduler"

    stored = applied(review_response(review(kinds.JOB, body, user="bob")), body)

    assert stored["metadata"]["annotations"] == {ANNOTATION_SUBMITTED_BY: "bob", "note": "mine"}
    assert stored["metadata"]["labels"] == {
        "gantry.io/priority-class": "high",
        "team": "nlp",
        LABEL_MANAGED: "true",
    }
    assert stored["spec"]["suspend"] is True
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "gantry"


def test_a_review_naming_no_user_leaves_no_users_claim() -> None:
    body = _job()
    body["metadata"]["annotations"] = {ANNOTATION_SUBMITTED_BY: "the-ceo"}
    stored = applied(review_response(review(kinds.JOB, body, user=None)), body)
    assert stored["metadata"]["annotations"] == {}
    assert stored["spec"]["suspend"] is True


@pytest.mark.parametrize("user_info", [{"username": ["alice"]}, {"username": 7}, "alice", None])
def test_a_username_that_is_not_a_string_names_nobody(user_info: Any) -> None:
    body = _job()
    body["metadata"]["annotations"] = {ANNOTATION_SUBMITTED_BY: "the-ceo"}
    incoming = review(kinds.JOB, body)
    incoming["request"]["userInfo"] = user_info
    stored = applied(review_response(incoming, exempt_users={"alice"}), body)
    assert stored["metadata"]["annotations"] == {}
    assert stored["spec"]["suspend"] is True


def test_null_fields_are_made_not_skipped() -> None:
    """A CRD's object may carry nulls: `runPolicy: null` must not let a PyTorchJob run."""
    body = _pytorchjob()
    body["spec"]["runPolicy"] = None
    body["metadata"]["labels"] = None
    stored = applied(review_response(review(kinds.PYTORCHJOB, body)), body)
    assert stored["spec"]["runPolicy"] == {"suspend": True}
    assert stored["metadata"]["labels"] == {LABEL_MANAGED: "true"}


def test_a_plain_pod_is_gated() -> None:
    body = _pod()
    body["spec"]["schedulingGates"] = [{"name": "example.com/other"}]
    stored = applied(review_response(review(kinds.POD, body, user="carol")), body)
    assert stored["spec"]["schedulingGates"] == [{"name": "example.com/other"}, {"name": GATE}]
    assert stored["spec"]["schedulerName"] == "gantry"
    assert stored["metadata"]["annotations"] == {ANNOTATION_SUBMITTED_BY: "carol"}
    assert stored["metadata"]["labels"] == {LABEL_MANAGED: "true"}


def test_a_pod_of_a_group_is_gated_with_its_group_labels_kept() -> None:
    labels = {"gantry.io/pod-group": "g1", "gantry.io/pod-group-size": "4"}
    body = obj(kinds.POD, "p-0", pod_spec(), labels=dict(labels))
    stored = applied(review_response(review(kinds.POD, body)), body)
    assert stored["spec"]["schedulingGates"] == [{"name": GATE}]
    assert stored["metadata"]["labels"] == {**labels, LABEL_MANAGED: "true"}


def test_a_pod_already_gated_by_gantry_is_not_gated_twice() -> None:
    body = _pod()
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    stored = applied(review_response(review(kinds.POD, body)), body)
    assert stored["spec"]["schedulingGates"] == [{"name": GATE}]


def _owned_by(body: Obj, api_version: str, kind: str, *, controller: bool = True) -> Obj:
    owner = {"apiVersion": api_version, "kind": kind, "name": "o", "uid": "u1"}
    body["metadata"]["ownerReferences"] = [{**owner, "controller": controller}]
    return body


@pytest.mark.parametrize(
    ("api_version", "owner"),
    [
        ("batch/v1", "Job"),
        ("kubeflow.org/v1", "PyTorchJob"),
        ("ray.io/v1", "RayCluster"),  # a RayJob's cluster
    ],
)
def test_a_pod_owned_by_a_held_kind_gets_only_the_scheduler(api_version: str, owner: str) -> None:
    body = _owned_by(_pod(), api_version, owner)
    before = copy.deepcopy(body)
    stored = applied(review_response(review(kinds.POD, body, user="system:serviceaccount:x")), body)
    before["spec"]["schedulerName"] = "gantry"
    assert stored == before  # no gate, no annotation naming the controller, no label


def test_a_job_of_a_jobset_is_not_held_again() -> None:
    """The JobSet is held; its controller makes the Jobs (suspended or not, as the set is)."""
    body = _owned_by(_job(), "jobset.x-k8s.io/v1alpha2", "JobSet")
    stored = applied(
        review_response(review(kinds.JOB, body, user="system:serviceaccount:js")), body
    )
    assert "suspend" not in stored["spec"]
    assert stored["spec"]["template"]["spec"]["schedulerName"] == "gantry"
    assert "annotations" not in stored["metadata"]


def test_a_jobset_of_a_trainjob_gets_the_scheduler_on_its_templates() -> None:
    body = _owned_by(_jobset(), "trainer.kubeflow.org/v1alpha1", "TrainJob")
    stored = applied(review_response(review(kinds.JOBSET, body)), body)
    assert "suspend" not in stored["spec"]
    assert [at(stored, p)["schedulerName"] for p in kinds.JOBSET.pod_specs(stored)] == [
        "gantry"
    ] * 2


@pytest.mark.parametrize(
    ("api_version", "owner", "controller"),
    [
        ("apps/v1", "StatefulSet", True),  # a LeaderWorkerSet's pods: held themselves
        ("apps/v1", "ReplicaSet", True),
        ("batch/v1", "Job", False),  # not its controller
    ],
)
def test_a_pod_owned_otherwise_is_gated(api_version: str, owner: str, controller: bool) -> None:
    body = _owned_by(_pod(), api_version, owner, controller=controller)
    body["metadata"]["labels"] = {"leaderworkerset.sigs.k8s.io/name": "lws"}
    stored = applied(
        review_response(review(kinds.POD, body, user="system:kube-controller-manager")), body
    )
    assert stored["spec"]["schedulingGates"] == [{"name": GATE}]
    assert stored["metadata"]["annotations"] == {
        ANNOTATION_SUBMITTED_BY: "system:kube-controller-manager"
    }


def test_gantrys_own_daemon_is_exempt() -> None:
    answer = review_response(review(kinds.POD, _pod(), user=DAEMON), exempt_users={DAEMON})
    assert answer["response"] == {"uid": answer["response"]["uid"], "allowed": True}


@pytest.mark.parametrize(
    "request_kind",
    [
        {"group": "apps", "version": "v1", "kind": "Deployment"},
        {"group": "", "version": "v1", "kind": "ConfigMap"},
        {"group": "example.com", "version": "v1", "kind": "Job"},  # a Job of another group
    ],
    ids=["Deployment", "ConfigMap", "other-group-Job"],
)
def test_an_unknown_kind_passes_unchanged(request_kind: Obj) -> None:
    incoming = review(kinds.JOB, _job())
    incoming["request"]["kind"] = request_kind
    answer = review_response(incoming)
    assert answer == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": incoming["request"]["uid"], "allowed": True},
    }


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE", "CONNECT"])
def test_only_a_create_is_mutated(operation: str) -> None:
    assert ops_of(review_response(review(kinds.JOB, _job(), operation=operation))) == []


MALFORMED: list[Any] = [
    None,
    [],
    "review",
    {},
    {"request": None},
    {"request": {"kind": {"group": "batch", "kind": "Job"}, "operation": "CREATE"}},  # no uid
    {"request": {"uid": 7}},
    {"request": {"uid": "u", "operation": "CREATE", "kind": "Job", "object": {}}},
    {"request": {"uid": "u", "operation": "CREATE", "kind": {"group": "batch", "kind": "Job"}}},
    {"request": {"uid": "u", "operation": "CREATE", "kind": {"kind": "Pod"}, "object": []}},
]


@pytest.mark.parametrize("incoming", MALFORMED)
def test_a_malformed_review_is_allowed_without_a_patch(incoming: Any) -> None:
    answer = review_response(incoming)
    response = answer["response"]
    assert response["allowed"] is True
    assert "patch" not in response
    uid = (incoming or {}).get("request") if isinstance(incoming, dict) else None
    assert response["uid"] == (
        uid.get("uid") if isinstance(uid, dict) and isinstance(uid.get("uid"), str) else ""
    )


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
FIELDS = st.sampled_from(
    [
        "metadata",
        "spec",
        "template",
        "annotations",
        "labels",
        "ownerReferences",
        "replicatedJobs",
        "pytorchReplicaSpecs",
        "rayClusterSpec",
        "workerGroupSpecs",
        "schedulingGates",
        "runPolicy",
    ]
)
SHAPED = st.recursive(
    st.none() | st.booleans() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(FIELDS, inner, max_size=4),
    max_leaves=25,
)


@given(
    kind=st.sampled_from(list(kinds.KINDS.values())),
    body=SHAPED | JSON,
    user=st.none() | st.text(max_size=4),
)
def test_any_object_of_a_known_kind_gets_an_answer_and_a_patch_that_applies(
    kind: kinds.Kind, body: Any, user: str | None
) -> None:
    """Whatever the object holds, the webhook answers, and its patch applies to the object
    (the API server would refuse the create on a patch that does not apply)."""
    answer = review_response(review(kind, body, user=user))
    assert answer["response"]["allowed"] is True
    if isinstance(body, dict):
        applied(answer, body)


KNOWN = st.sampled_from(
    [{"group": k.group, "version": k.version, "kind": k.kind} for k in kinds.KINDS.values()]
)
REQUESTS = st.fixed_dictionaries(
    {},
    optional={
        "uid": st.text(max_size=4) | JSON,
        "kind": KNOWN | JSON,
        "operation": st.sampled_from(["CREATE", "UPDATE"]) | JSON,
        "userInfo": st.fixed_dictionaries({}, optional={"username": JSON}) | JSON,
        "object": SHAPED | JSON,
    },
)


@given(request=REQUESTS)
def test_any_review_gets_an_allowed_answer(request: Obj) -> None:
    """Whatever the API server (or anyone else) sends, the webhook answers, never fails."""
    answer = review_response({"request": request})
    assert answer["response"]["allowed"] is True
    if isinstance(request.get("object"), dict) and "patch" in answer["response"]:
        applied(answer, request["object"])
