"""RBAC of platform/k8s/02-rbac.yaml: each account may do what Gantry needs, and nothing more.

The table (tests/k8s/rbac_table.py) says what the scheduler daemon, the web, the worker and beat,
the node agent and the migrate job must and must not do. Checked four ways:
- offline: every client method the backend calls maps to the table's rows, and the rows to those
  methods (a new call without its grant, or a grant no call needs, fails here first); the roles
  the manifest binds to each account grant exactly the table's MUST;
- SubjectAccessReview, as the admin on the real API server, for every row: MUST allowed and
  MUST NOT denied, in a project's namespace, Gantry's own and kube-system;
- SelfSubjectRulesReview with each account's own token: nothing granted beyond MUST (minus what
  every service account gets, taken from an account bound to nothing);
- real calls with each account's token (TokenRequest): one the account needs succeeds past
  authorization, one it must not make is refused with 403, so that the reviews are not the
  only witness.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from devcluster import crds
from scheduler.backends.base import LogTarget
from scheduler.backends.kubernetes.backend import ApiRejected, KubernetesBackend
from scheduler.backends.kubernetes.config import KubernetesConfig
from scheduler.backends.kubernetes.render import ADMISSION_GATE as GATE
from scheduler.backends.kubernetes.render import LABEL_HELD as HELD
from scheduler.backends.kubernetes.resume import resume_patch
from scheduler.backends.retry import RetryPolicy
from scheduler.backends.workloads import PYTORCHJOB
from scheduler.workloads.kinds import LEADERWORKERSET
from scheduler.workloads.queued_kinds import CUSTOM
from scheduler.workloads.status import status_annotations
from tests.k8s.builders import make_request
from tests.k8s.rbac_table import (
    ACCOUNTS,
    AGENT,
    APP,
    CLIENT_METHODS,
    MIGRATE,
    MUST,
    MUST_NOT,
    NAMESPACE,
    OTHER_NS,
    PROJECT_ONLY,
    SCHEDULER,
    WEB_CLIENT_METHODS,
    WORKER,
    WORKLOADS,
    Permission,
    namespaces_of,
    username,
)
from tests.k8s.real_api import (
    ROOT,
    Answer,
    Paths,
    apply,
    client_with_token,
    manifests,
    request,
    token_for,
)
from tests.k8s.real_plane import WAIT_S, RealPlane

BACKENDS = ROOT / "scheduler" / "backends"
RBAC = ROOT / "platform" / "k8s" / "02-rbac.yaml"
TENANT_TEMPLATE = "tenant-namespace.yaml"  # the log RoleBinding the daemon makes in a project
# The backend's clients (attributes of KubernetesBackend) and their classes.
CLIENTS = {
    "core": "CoreV1Api",
    "networking": "NetworkingV1Api",
    "rbac": "RbacAuthorizationV1Api",
    "batch": "BatchV1Api",
    "custom": "CustomObjectsApi",
}
# The backend's methods the workload controller calls (scheduler/workloads/controller.py), and
# those both it and the daemon call.
# The workload controller's: its reads (`held_list_watch`: its watches) and its writes of
# Gantry's status annotations; the daemon shares its events and, for reconcile's sweep of
# held Jobs (scheduler/daemon/strays.py), its list of them.
CONTROLLER_METHODS = frozenset(
    {"list_held_pods", "held_list_watch", "annotate", "read_training_runtime"}
)
SHARED_METHODS = frozenset({"record_event", "list_held_jobs", "list_held_objects"})
BASELINE = "gantry-rbac-baseline"  # bound to nothing: what every service account may do
PROBE_POD = "rbac-log-probe"
# Unbound, and admitted by Pod Security `restricted` (a project namespace enforces it).
PROBE = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": PROBE_POD},
    "spec": {
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "main",
                "image": "gantry:0.1.0",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    },
}


# -- offline: the table against the code and the manifest -----------------------------------


def _log_source_methods() -> set[str]:
    """The LogSource protocol's methods: what the web process calls on the backend."""
    tree = ast.parse((BACKENDS / "base.py").read_text())
    (protocol,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LogSource"]
    return {n.name for n in protocol.body if isinstance(n, ast.FunctionDef)}


@dataclass(frozen=True)
class ClientUse:
    method: str  # the client method (of CoreV1Api, NetworkingV1Api, RbacAuthorizationV1Api)
    caller: str  # the backend's method it is used in (outermost)
    where: str


def client_uses(files: list[Path]) -> list[ClientUse]:
    """Every `self.core.<method>` (or `self.networking`, `self.rbac`) the Kubernetes backend
    calls or hands on (watches pass the list method itself), with the backend method it sits
    in."""
    uses: list[ClientUse] = []
    for path in files:
        tree = ast.parse(path.read_text())
        for top in ast.walk(tree):
            if not isinstance(top, ast.ClassDef):
                continue
            for method in top.body:
                if not isinstance(method, ast.FunctionDef):
                    continue
                for node in ast.walk(method):
                    if (
                        isinstance(node, ast.Attribute)
                        and isinstance(node.value, ast.Attribute)
                        and node.value.attr in CLIENTS
                        and isinstance(node.value.value, ast.Name)
                        and node.value.value.id == "self"
                    ):
                        where = f"{path.name}:{node.lineno}"
                        uses.append(ClientUse(node.attr, method.name, where))
    return uses


def _api_classes(files: list[Path]) -> set[str]:
    """The client's API classes the backend builds (client.CoreV1Api(...) and the like)."""
    found = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr.endswith("Api")
                and node.func.attr != "ApiClient"
            ):
                found.add(node.func.attr)
    return found


def _backend_files() -> list[Path]:
    return sorted((BACKENDS / "kubernetes").glob("*.py"))


def test_the_backend_calls_only_the_api_classes_the_table_knows() -> None:
    """The table's methods are those of the backend's three clients: a call through another API
    class (AppsV1Api, PolicyV1Api for evictions...) needs its rows first."""
    assert _api_classes(_backend_files()) == set(CLIENTS.values())


def test_every_client_method_the_backend_calls_has_its_row_in_the_rbac_table() -> None:
    uses = client_uses(_backend_files())
    called = {use.method for use in uses}
    unmapped = sorted(f"{u.method} ({u.where})" for u in uses if u.method not in CLIENT_METHODS)
    assert not unmapped, f"add these to CLIENT_METHODS and the accounts' MUST: {unmapped}"
    stale = sorted(set(CLIENT_METHODS) - called)
    assert not stale, f"CLIENT_METHODS names methods the backend no longer calls: {stale}"

    web = _log_source_methods()
    needs: dict[str, set[Permission]] = {SCHEDULER: set(), APP: set(), WORKLOADS: set()}
    for use in uses:
        if use.caller in web:
            needs[APP] |= CLIENT_METHODS[use.method]
        if use.caller in CONTROLLER_METHODS | SHARED_METHODS:
            needs[WORKLOADS] |= CLIENT_METHODS[use.method]
        if use.caller not in web | CONTROLLER_METHODS:
            needs[SCHEDULER] |= CLIENT_METHODS[use.method]
    web_calls = _agent_auth_calls()
    assert web_calls == set(WEB_CLIENT_METHODS), web_calls
    for method in web_calls:
        needs[APP] |= WEB_CLIENT_METHODS[method]
    assert needs[SCHEDULER] == MUST[SCHEDULER], _difference(needs[SCHEDULER], MUST[SCHEDULER])
    assert needs[APP] == MUST[APP], _difference(needs[APP], MUST[APP])
    assert needs[WORKLOADS] == MUST[WORKLOADS], _difference(needs[WORKLOADS], MUST[WORKLOADS])


def _agent_auth_calls() -> set[str]:
    """The client methods scheduler/nodes/agent_auth.py calls (`self.api.<method>`)."""
    tree = ast.parse((ROOT / "scheduler" / "nodes" / "agent_auth.py").read_text())
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "api"
    }


def test_the_drift_check_sees_a_new_client_call(tmp_path: Path) -> None:
    """The check above reads the code, not a list: a call it has never seen shows up."""
    source = tmp_path / "kubernetes_extra.py"
    source.write_text(
        "class B:\n    def drain(self):\n        self.core.create_namespaced_pod_eviction(1)\n"
    )
    (use,) = client_uses([source])
    assert (use.method, use.caller) == ("create_namespaced_pod_eviction", "drain")
    assert use.method not in CLIENT_METHODS


def test_must_and_must_not_never_overlap() -> None:
    for account in ACCOUNTS:
        assert not MUST[account] & MUST_NOT[account], account


def _expand(rules: list[dict[str, Any]]) -> set[Permission]:
    granted = set()
    for rule in rules:
        assert not rule.get("nonResourceURLs"), f"a rule on non-resource URLs: {rule}"
        for group in rule.get("apiGroups", ()):
            for resource in rule.get("resources", ()):
                for verb in rule.get("verbs", ()):
                    assert "*" not in (group, resource, verb), f"a wildcard: {rule}"
                    for name in rule.get("resourceNames") or [""]:
                        granted.add(Permission(group, resource, verb, name))
    return granted


def _difference(granted: set[Permission], wanted: set[Permission]) -> str:
    extra = sorted(map(str, granted - wanted))
    missing = sorted(map(str, wanted - granted))
    return f"beyond the table: {extra}; missing: {missing}"


def test_the_manifest_grants_each_account_exactly_its_must() -> None:
    """02-rbac.yaml's bindings, and the one the daemon makes in each project namespace (the
    template holds the same: tests/test_platform.py)."""
    docs = [m.doc for m in manifests(RBAC.name, TENANT_TEMPLATE)]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    granted: dict[str, set[Permission]] = {account: set() for account in ACCOUNTS}
    for binding in (d for d in docs if d["kind"].endswith("RoleBinding")):
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["namespace"] == NAMESPACE
            granted[subject["name"]] |= _expand(role["rules"])
    for binding in (d for d in docs if d["kind"] == "RoleBinding"):
        assert binding["metadata"]["namespace"] != NAMESPACE, "no grant in Gantry's namespace"
    for account in ACCOUNTS:
        assert granted[account] == MUST[account], f"{account}: " + _difference(
            granted[account], MUST[account]
        )


# -- the real API server ------------------------------------------------------------------


@dataclass
class Accounts:
    api: client.ApiClient  # the admin's
    clients: dict[str, client.ApiClient]  # each account's own token, and the baseline's
    scratch: str  # a namespace the scheduler's token creates
    probe: str  # a namespace with an unbound pod, made by the admin
    project: str  # a project namespace made by the backend (its log RoleBinding), with a pod


@pytest.fixture(scope="module")
def accounts(real_plane: RealPlane) -> Iterator[Accounts]:
    api = real_plane.api
    paths = Paths(api)
    # The kinds users create that Gantry queues, at their pinned releases: the scheduler's
    # policy for them is typed against their schemas.
    installed = crds.install(api, ["JobSet", "RayJob", "TrainJob", "PyTorchJob", "LeaderWorkerSet"])
    for resource in installed.values():
        _wait_until_served(api, resource)
    for manifest in manifests(
        "00-namespace.yaml", "02-rbac.yaml", "04-admission.yaml", "26-workload-status.yaml"
    ):
        answer = apply(api, paths, manifest.doc)
        assert answer.status in (200, 201), f"{manifest.id}: {answer.message}"
    baseline = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": BASELINE, "namespace": NAMESPACE},
    }
    assert apply(api, paths, baseline).status in (200, 201)
    clients = {
        account: client_with_token(api, token_for(api, NAMESPACE, account))
        for account in (*ACCOUNTS, BASELINE)
    }
    scratch, probe, project = (f"gantry-rbac-{uuid.uuid4().hex[:8]}" for _ in range(3))
    assert (
        request(api, "POST", "/api/v1/namespaces", body={"metadata": {"name": probe}}).status == 201
    )
    _backend(api)[0].ensure_namespace(project)
    for namespace in (probe, project):
        created = request(api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=PROBE)
        assert created.status == 201, created
    yield Accounts(api, clients, scratch, probe, project)
    for held in clients.values():
        held.close()
    request(api, "DELETE", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{BASELINE}")
    for namespace in (scratch, probe, project):
        request(api, "DELETE", f"/api/v1/namespaces/{namespace}")


def _wait_until_served(api: client.ApiClient, resource: crds.Resource) -> None:
    """A CRD just Established may still answer a list 429 "storage is (re)initializing" (Retry-
    After 1) for a moment: wait until its objects list."""
    path = f"/apis/{resource.group}/{resource.version}/{resource.plural}"
    deadline = time.monotonic() + WAIT_S
    while (answer := request(api, "GET", path)).status != 200:
        assert time.monotonic() < deadline, f"{path} never listed: {answer.message}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def policies(accounts: Accounts) -> None:
    """A new ValidatingAdmissionPolicy takes effect once the API server's informer has it:
    wait until the probe (a dry-run namespace without Gantry's labels) is refused."""
    scheduler = accounts.clients[SCHEDULER]
    deadline = time.monotonic() + WAIT_S
    probe = {"metadata": {"name": "gantry-policy-probe"}}
    while True:
        answer = request(
            scheduler, "POST", "/api/v1/namespaces", body=probe, query=[("dryRun", "All")]
        )
        if answer.status == 403:
            return
        assert time.monotonic() < deadline, f"the admission policies never applied: {answer}"
        time.sleep(0.2)


def _access_review(
    api: client.ApiClient, user: str, permission: Permission, ns: str | None
) -> bool:
    resource, _, subresource = permission.resource.partition("/")
    attributes = {"group": permission.group, "resource": resource, "verb": permission.verb}
    if permission.name:
        attributes["name"] = permission.name
    if subresource:
        attributes["subresource"] = subresource
    if ns is not None:
        attributes["namespace"] = ns
    groups = [
        "system:serviceaccounts",
        f"system:serviceaccounts:{NAMESPACE}",
        "system:authenticated",
    ]
    answer = request(
        api,
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": groups, "resourceAttributes": attributes},
        },
    )
    assert answer.status == 201, answer
    return bool(answer.body["status"].get("allowed"))


@pytest.mark.kubernetes
@pytest.mark.parametrize("account", ACCOUNTS)
def test_subject_access_review_allows_every_must(accounts: Accounts, account: str) -> None:
    refused = [
        f"{permission} in {ns or 'the cluster'}"
        for permission in sorted(MUST[account])
        for ns in namespaces_of(permission, account, accounts.project)
        if not _access_review(accounts.api, username(account), permission, ns)
    ]
    assert not refused, f"{account} may not: {refused}"


@pytest.mark.kubernetes
@pytest.mark.parametrize("account", ACCOUNTS)
def test_subject_access_review_denies_every_must_not(accounts: Accounts, account: str) -> None:
    allowed = [
        f"{permission} in {ns or 'the cluster'}"
        for permission in sorted(MUST_NOT[account])
        for ns in namespaces_of(permission, account, accounts.project)
        if _access_review(accounts.api, username(account), permission, ns)
    ]
    assert not allowed, f"{account} may: {allowed}"


@pytest.mark.kubernetes
def test_project_only_grants_stop_at_the_project_namespaces(accounts: Accounts) -> None:
    """The web reads job logs in a project's namespace only: not Gantry's own pods' logs (its
    secrets in the environment of a crash), not kube-system's, not a namespace Gantry did not
    make."""
    allowed = [
        f"{account}: {permission} in {ns}"
        for account, permissions in PROJECT_ONLY.items()
        for permission in sorted(permissions)
        for ns in (NAMESPACE, OTHER_NS, accounts.probe)
        if _access_review(accounts.api, username(account), permission, ns)
    ]
    assert not allowed, allowed


def _rules_of(api: client.ApiClient, namespace: str) -> set[Permission]:
    answer = request(
        api,
        "POST",
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectRulesReview",
            "spec": {"namespace": namespace},
        },
    )
    assert answer.status == 201, answer
    rules = answer.body["status"]["resourceRules"]
    return {
        Permission(group, resource, verb, name)
        for rule in rules
        for group in rule.get("apiGroups", ())
        for resource in rule.get("resources", ())
        for verb in rule.get("verbs", ())
        for name in rule.get("resourceNames") or [""]
    }


@pytest.mark.kubernetes
@pytest.mark.parametrize("account", ACCOUNTS)
def test_each_account_holds_nothing_beyond_its_must(accounts: Accounts, account: str) -> None:
    """What the server says the account's token may do, less what any service account may
    do, is exactly MUST: in a project's namespace; in kube-system, less PROJECT_ONLY."""
    for namespace in (accounts.project, "kube-system"):
        baseline = _rules_of(accounts.clients[BASELINE], namespace)
        held = _rules_of(accounts.clients[account], namespace) - baseline
        wanted = MUST[account]
        if namespace == "kube-system":
            wanted = wanted - PROJECT_ONLY.get(account, set())
        assert held == wanted, f"{account} in {namespace}: " + _difference(held, wanted)


# -- real calls with each account's own token -----------------------------------------------


def _who(api: client.ApiClient) -> str:
    answer = request(
        api,
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    assert answer.status == 201, answer
    name: str = answer.body["status"]["userInfo"]["username"]
    return name


def _forbidden(answer: Answer, account: str) -> None:
    assert answer.status == 403, answer
    assert f'User "{username(account)}" cannot' in answer.message, answer.message


@pytest.mark.kubernetes
@pytest.mark.parametrize("account", ACCOUNTS)
def test_each_token_authenticates_as_its_account(accounts: Accounts, account: str) -> None:
    """So that the refusals below are authorization's, not a failed login's."""
    assert _who(accounts.clients[account]) == username(account)


@pytest.mark.kubernetes
def test_the_scheduler_creates_a_namespace_and_lists_pods_but_reads_no_secret(
    accounts: Accounts,
) -> None:
    scheduler = accounts.clients[SCHEDULER]
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": accounts.scratch,
            "labels": {
                "app.kubernetes.io/managed-by": "gantry",
                "pod-security.kubernetes.io/enforce": "restricted",
            },
        },
    }
    created = request(scheduler, "POST", "/api/v1/namespaces", body=namespace)
    assert created.status == 201, created
    listed = request(
        scheduler,
        "GET",
        "/api/v1/pods",
        query=[("labelSelector", "app.kubernetes.io/managed-by=gantry")],
    )
    assert listed.status == 200, listed
    _forbidden(request(scheduler, "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets"), SCHEDULER)
    _forbidden(request(scheduler, "DELETE", "/api/v1/nodes/real-gpu-1"), SCHEDULER)
    _forbidden(request(scheduler, "DELETE", f"/api/v1/namespaces/{accounts.scratch}"), SCHEDULER)


@pytest.mark.kubernetes
def test_the_web_app_reads_a_pods_log_but_cannot_list_pods(accounts: Accounts) -> None:
    """pods/log in a project's namespace is authorized and read (empty: the pod has no node
    yet), while listing or reading the pods themselves is refused, and so is a log of a
    namespace Gantry did not make."""
    namespace = accounts.project
    web = accounts.clients[APP]
    log = request(web, "GET", f"/api/v1/namespaces/{namespace}/pods/{PROBE_POD}/log")
    assert log.status in (200, 204), log
    _forbidden(
        request(web, "GET", f"/api/v1/namespaces/{accounts.probe}/pods/{PROBE_POD}/log"), APP
    )
    _forbidden(request(web, "GET", f"/api/v1/namespaces/{namespace}/pods"), APP)
    _forbidden(request(web, "GET", f"/api/v1/namespaces/{namespace}/pods/{PROBE_POD}"), APP)
    _forbidden(request(web, "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets/gantry-secrets"), APP)


@pytest.mark.kubernetes
@pytest.mark.parametrize("account", [WORKER, AGENT, MIGRATE])
def test_the_agent_and_migrate_job_may_do_nothing(accounts: Accounts, account: str) -> None:
    """They mount no token (automountServiceAccountToken: false); one made for them anyway
    authenticates and can do nothing with the cluster."""
    held = accounts.clients[account]
    assert _who(held) == username(account)  # the allowed call: who am I
    _forbidden(request(held, "GET", "/api/v1/nodes"), account)
    _forbidden(request(held, "GET", f"/api/v1/namespaces/{NAMESPACE}/pods"), account)


def test_agent_and_migrate_mount_no_token() -> None:
    """Nor do the worker and beat: they never call the Kubernetes API. (The agent's token is a
    projected one of its own audience, for Gantry's API only: tests/k8s/test_agent_token_real.)"""
    docs = {(m.doc["kind"], m.doc["metadata"]["name"]): m.doc for m in manifests()}
    for account in (WORKER, AGENT, MIGRATE):
        assert docs[("ServiceAccount", account)].get("automountServiceAccountToken") is False
    for kind, name in (
        ("DaemonSet", "gantry-node-agent"),
        ("Job", "gantry-migrate"),
        ("Deployment", "gantry-worker"),
        ("Deployment", "gantry-beat"),
    ):
        spec = docs[(kind, name)]["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is False, name


# -- the backend itself, with each account's token -------------------------------------------


class Recording:
    """The backend's CoreV1Api, noting which of its methods the backend took."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.used: set[str] = set()

    def __getattr__(self, name: str) -> Any:
        self.used.add(name)
        return getattr(self._core, name)


def _backend(api: client.ApiClient) -> tuple[KubernetesBackend, Recording]:
    """The backend with `api`'s credentials; the Recording notes the methods it takes of each
    of its clients."""
    # Retried as deployed: the plane is shared, and a CRD another test installs answers 429
    # ("storage is (re)initializing", Retry-After 1 s) for a moment (seen in a run here).
    backend = KubernetesBackend(
        api, KubernetesConfig(request_timeout_s=10.0), policy=RetryPolicy(attempts=5)
    )
    recording = Recording(backend.core)
    backend.core = recording  # type: ignore[assignment]
    for attribute in ("networking", "rbac", "batch", "custom"):
        wrapped = Recording(getattr(backend, attribute))
        wrapped.used = recording.used
        setattr(backend, attribute, wrapped)
    return backend, recording


def _methods_of(account: str) -> set[str]:
    web = _log_source_methods()
    uses = client_uses(_backend_files())
    if account == WORKLOADS:
        return {u.method for u in uses if u.caller in CONTROLLER_METHODS | SHARED_METHODS}
    if account == APP:
        return {u.method for u in uses if u.caller in web}
    return {u.method for u in uses if u.caller not in web | CONTROLLER_METHODS}


@pytest.fixture
def probe_node(accounts: Accounts) -> Iterator[str]:
    """A node of this test's own (no kubelet: nothing runs on it), tainted like a GPU node, so
    that cordoning it and binding to it disturb no other test's nodes."""
    name = f"rbac-node-{uuid.uuid4().hex[:6]}"
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
    }
    created = request(accounts.api, "POST", "/api/v1/nodes", body=node)
    assert created.status == 201, created
    yield name
    request(accounts.api, "DELETE", f"/api/v1/nodes/{name}")


@pytest.mark.kubernetes
def test_the_scheduler_daemon_does_its_whole_job_with_its_own_token(
    accounts: Accounts, probe_node: str
) -> None:
    """Every ClusterBackend call the daemon makes, through the backend, as gantry-scheduler:
    RBAC and the admission policies leave it all it needs (the MUST side, end to end): every
    client method of the table that is the daemon's is taken, and answered."""
    backend, recording = _backend(accounts.clients[SCHEDULER])
    assert probe_node in {n.name for n in backend.list_nodes()}
    assert backend.get_node(probe_node) is not None
    backend.set_node_unschedulable(probe_node, True)
    backend.set_node_unschedulable(probe_node, False)

    namespace = f"gantry-rbac-{uuid.uuid4().hex[:8]}"
    try:
        backend.ensure_namespace(namespace)
        first = make_request(namespace=namespace, node=probe_node, replicas=2, replica=0)
        second = make_request(namespace=namespace, node=probe_node, replicas=2, replica=1)
        backend.create_pod(first)  # and the headless Service of a distributed job
        backend.create_pod(second)
        backend.create_pod(first)  # again: the conflict is resolved by reading the pod
        backend.bind_pod(namespace, first.name, probe_node)
        backend.record_event(namespace, first.name, "Waiting", "for a GPU")
        # A pod its user created, held by Gantry's webhook: admitted (patched) and bound.
        held = copy.deepcopy(PROBE)
        held["metadata"] |= {"name": "users-pod", "labels": {HELD: "true", "team": "nlp"}}
        held["spec"] |= {"schedulerName": "gantry", "schedulingGates": [{"name": GATE}]}
        made = request(accounts.api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=held)
        assert made.status == 201, made.message
        users = make_request(namespace=namespace, node=probe_node, job_id=8)
        backend.create_pod(dataclasses.replace(users, name="users-pod", held=True))
        admitted = request(accounts.api, "GET", f"/api/v1/namespaces/{namespace}/pods/users-pod")
        assert admitted.body["spec"]["nodeName"] == probe_node
        assert not admitted.body["spec"].get("schedulingGates")
        assert admitted.body["metadata"]["labels"]["team"] == "nlp"
        # A Job its user created, held suspended: admitted, then suspended again.
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "users-job", "labels": {HELD: "true"}},
            "spec": {"suspend": True, "template": {"spec": {**copy.deepcopy(PROBE["spec"])}}},
        }
        job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
        jobs = f"/apis/batch/v1/namespaces/{namespace}/jobs"
        made = request(accounts.api, "POST", jobs, body=job)
        assert made.status == 201, made.message
        for_job = make_request(namespace=namespace, node=probe_node, job_id=9)
        backend.create_pod(dataclasses.replace(for_job, workload="jobs/users-job"))
        read = request(accounts.api, "GET", f"{jobs}/users-job").body
        assert read["spec"]["suspend"] is False
        assert read["spec"]["template"]["metadata"]["labels"]["gantry.io/job-id"] == "9"
        backend.suspend_workload(namespace, "jobs/users-job")
        assert request(accounts.api, "GET", f"{jobs}/users-job").body["spec"]["suspend"] is True
        # A JobSet its user created, held suspended: admitted, then suspended again.
        jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets"
        made = request(accounts.api, "POST", jobsets, body=_jobset("users-jobset"))
        assert made.status == 201, made.message
        backend.create_pod(dataclasses.replace(for_job, workload="jobsets/users-jobset"))
        read = request(accounts.api, "GET", f"{jobsets}/users-jobset").body
        assert read["spec"]["suspend"] is False
        template = read["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        assert template["metadata"]["labels"]["gantry.io/job-id"] == "9"
        backend.suspend_workload(namespace, "jobsets/users-jobset")
        read = request(accounts.api, "GET", f"{jobsets}/users-jobset").body
        assert read["spec"]["suspend"] is True
        assert {first.name, second.name} <= {p.name for p in backend.list_pods()}
        assert isinstance(backend.list_held_jobs(), list)  # reconcile's sweep
        assert isinstance(backend.list_held_objects("ray.io", "v1", "rayjobs"), list)
        watcher = backend.pod_watcher(lambda _pods: None, lambda _kind, _pod: None, timeout_s=1)
        watcher.run_once()  # the list
        watcher.run_once()  # the watch, ended by the server after a second
        nodes = backend.node_watcher(lambda _nodes: None, lambda _kind, _node: None, timeout_s=1)
        nodes.run_once()
        nodes.run_once()
        services = request(accounts.api, "GET", f"/api/v1/namespaces/{namespace}/services")
        assert len(services.body["items"]) == 1  # before its owner goes, and it with it
        backend.delete_pod(namespace, first.name, grace_period_s=0)
    finally:
        request(accounts.api, "DELETE", f"/api/v1/namespaces/{namespace}")
    assert recording.used == _methods_of(SCHEDULER)


@pytest.mark.kubernetes
def test_the_workload_controller_does_its_whole_job_with_its_own_token(
    accounts: Accounts,
) -> None:
    """It lists the held pods and Jobs, and tells their users in events: with its own token,
    every client method of the table that is the controller's is taken, and answered."""
    backend, recording = _backend(accounts.clients[WORKLOADS])
    assert isinstance(backend.list_held_pods(), list)
    assert isinstance(backend.list_held_jobs(), list)
    for kind in (*(q.kind for q in CUSTOM), LEADERWORKERSET):
        assert isinstance(backend.list_held_objects(kind.group, kind.version, kind.plural), list)
    backend.record_event(accounts.project, PROBE_POD, "Queued", "waiting for a GPU")
    for runtime in ("ClusterTrainingRuntime", "TrainingRuntime"):  # a TrainJob's: none here
        assert backend.read_training_runtime(accounts.project, runtime, "absent") is None
    list_all, open_stream = backend.held_list_watch("", "v1", "pods")
    assert isinstance(list_all()[0], list)
    stream = open_stream(list_all()[1], 1)  # its watch, closed unread
    stream.close()
    stream.release_conn()
    pod = ("v1", "Pod", "")
    backend.annotate(accounts.project, PROBE_POD, pod, status_annotations("Queued", "why"))
    for about in (("batch/v1", "Job", ""), ("jobset.x-k8s.io/v1alpha2", "JobSet", "")):
        backend.annotate(accounts.project, "gone", about, status_annotations("Queued", "why"))
    assert recording.used == _methods_of(WORKLOADS)
    with pytest.raises(ApiRejected) as refused:
        backend.delete_pod(accounts.project, PROBE_POD, grace_period_s=0)
    assert refused.value.status == 403


@pytest.mark.kubernetes
def test_the_web_app_reads_logs_through_the_backend_and_nothing_else(
    accounts: Accounts,
) -> None:
    backend, recording = _backend(accounts.clients[APP])
    target = LogTarget(
        namespace=accounts.project,
        pod=PROBE_POD,
        job_id=1,
        attempt=0,
        replica=0,
        job_type="training",
        started_at=datetime(2026, 1, 1, tzinfo=UTC),
        ended_at=None,
    )
    page = backend.read_log(target, now=datetime.now(UTC))
    assert page.lines == ()
    with pytest.raises(ApiRejected) as refused:
        backend.list_pods()
    assert refused.value.status == 403
    assert _methods_of(APP) <= recording.used


# -- what RBAC cannot say: the scheduler's admission policies (04-admission.yaml) ------------


def _refused_by_policy(answer: Answer, policy: str) -> None:
    assert answer.status == 403, answer
    assert f"ValidatingAdmissionPolicy '{policy}'" in answer.message, answer.message


UNBOUND_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "rbac-policy-probe"},
    "spec": {"containers": [{"name": "main", "image": "gantry:0.1.0"}]},
}


@pytest.mark.kubernetes
def test_the_scheduler_writes_pods_only_in_gantrys_namespaces(
    accounts: Accounts, policies: None
) -> None:
    """Its ClusterRole lets it create and delete pods anywhere; the policy keeps it to the
    namespaces labelled as Gantry's: not kube-system, not a namespace someone else made."""
    scheduler = accounts.clients[SCHEDULER]
    dry = [("dryRun", "All")]
    policy = "gantry-scheduler-namespaces"
    for namespace in ("kube-system", accounts.probe):
        created = request(
            scheduler, "POST", f"/api/v1/namespaces/{namespace}/pods", body=UNBOUND_POD, query=dry
        )
        _refused_by_policy(created, policy)
    deleted = request(
        scheduler, "DELETE", f"/api/v1/namespaces/{accounts.probe}/pods/{PROBE_POD}", query=dry
    )
    _refused_by_policy(deleted, policy)
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": PROBE_POD},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "real-gpu-1"},
    }
    bound = request(
        scheduler,
        "POST",
        f"/api/v1/namespaces/{accounts.probe}/pods/{PROBE_POD}/binding",
        body=binding,
        query=dry,
    )
    _refused_by_policy(bound, policy)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "rbac-probe"}}
    service["spec"] = {"clusterIP": "None", "selector": {"a": "b"}}
    created = request(
        scheduler, "POST", "/api/v1/namespaces/kube-system/services", body=service, query=dry
    )
    _refused_by_policy(created, policy)


@pytest.mark.kubernetes
def test_the_scheduler_patches_a_pod_only_to_admit_it(accounts: Accounts, policies: None) -> None:
    """pods patch is for admitting a held pod: Gantry's labels on, its gate off. Changing what
    the pod runs, or its user's labels, is refused; the admission patch itself is taken."""
    scheduler = accounts.clients[SCHEDULER]
    policy = "gantry-scheduler-pod-admission"
    path = f"/api/v1/namespaces/{accounts.project}/pods/{PROBE_POD}"
    json_patch = "application/json-patch+json"

    def patch(ops: list[dict[str, Any]]) -> Answer:
        return request(
            scheduler, "PATCH", path, body=ops, query=[("dryRun", "All")], content_type=json_patch
        )

    admit = [{"op": "add", "path": "/metadata/labels", "value": {"gantry.io/job-id": "8"}}]
    assert patch(admit).status == 200, patch(admit).message
    image = [{"op": "replace", "path": "/spec/containers/0/image", "value": "evil:1"}]
    _refused_by_policy(patch(image), policy)
    deadline = [{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 5}]
    _refused_by_policy(patch(deadline), policy)
    theirs = [{"op": "add", "path": "/metadata/labels", "value": {"team": "someone-else"}}]
    _refused_by_policy(patch(theirs), policy)


@pytest.mark.kubernetes
def test_the_scheduler_patches_a_job_only_to_admit_or_suspend_it(
    accounts: Accounts, policies: None
) -> None:
    scheduler = accounts.clients[SCHEDULER]
    jobs = f"/apis/batch/v1/namespaces/{accounts.project}/jobs"
    spec = {**copy.deepcopy(PROBE["spec"]), "restartPolicy": "Never"}
    body = {"metadata": {"name": "rbac-job"}, "spec": {"suspend": True, "template": {"spec": spec}}}
    made = request(accounts.api, "POST", jobs, body=body)
    assert made.status == 201, made.message
    try:

        def patch(ops: list[dict[str, Any]]) -> Answer:
            return request(
                scheduler,
                "PATCH",
                f"{jobs}/rbac-job",
                body=ops,
                query=[("dryRun", "All")],
                content_type="application/json-patch+json",
            )

        labels = "/spec/template/metadata/labels/gantry.io~1job-id"
        admit = [
            {"op": "add", "path": labels, "value": "8"},
            {"op": "replace", "path": "/spec/suspend", "value": False},
        ]
        assert patch(admit).status == 200, patch(admit).message
        policy = "gantry-scheduler-job-admission"
        # The API server keeps the template's spec itself (immutable: its containers); the
        # template's annotations a suspended Job may change, but not the scheduler.
        note = [{"op": "add", "path": "/spec/template/metadata/annotations", "value": {"a": "b"}}]
        _refused_by_policy(patch(note), policy)
        retries = [{"op": "add", "path": "/spec/backoffLimit", "value": 100}]
        _refused_by_policy(patch(retries), policy)
        theirs = [{"op": "add", "path": "/spec/template/metadata/labels/team", "value": "x"}]
        _refused_by_policy(patch(theirs), policy)
    finally:
        request(accounts.api, "DELETE", f"{jobs}/rbac-job")


def _jobset(name: str) -> dict[str, Any]:
    """A JobSet as Gantry's webhook holds it: suspended, labelled held."""
    spec = {**copy.deepcopy(PROBE["spec"]), "restartPolicy": "Never"}
    job = {"parallelism": 1, "completions": 1, "template": {"spec": spec}}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {HELD: "true"}},
        "spec": {
            "suspend": True,
            "replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": job}}],
        },
    }


@pytest.mark.kubernetes
def test_the_scheduler_patches_a_jobset_only_to_admit_or_suspend_it(
    accounts: Accounts, policies: None
) -> None:
    """gantry-scheduler-workload-admission: Gantry's labels on the templates and the suspension,
    nothing else (the JobSet CRD at its pinned release; its own webhook is not running)."""
    scheduler = accounts.clients[SCHEDULER]
    jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{accounts.project}/jobsets"
    made = request(accounts.api, "POST", jobsets, body=_jobset("rbac-jobset"))
    assert made.status == 201, made.message
    try:

        def patch(ops: list[dict[str, Any]]) -> Answer:
            return request(
                scheduler,
                "PATCH",
                f"{jobsets}/rbac-jobset",
                body=ops,
                query=[("dryRun", "All")],
                content_type="application/json-patch+json",
            )

        template = "/spec/replicatedJobs/0/template/spec/template"
        admit = [
            {
                "op": "add",
                "path": f"{template}/metadata",
                "value": {"labels": {"gantry.io/job-id": "8"}},
            },
            {"op": "replace", "path": "/spec/suspend", "value": False},
        ]
        assert patch(admit).status == 200, patch(admit).message
        policy = "gantry-scheduler-workload-admission"
        theirs = [{"op": "add", "path": f"{template}/metadata", "value": {"labels": {"team": "x"}}}]
        _refused_by_policy(patch(theirs), policy)
        more = [{"op": "replace", "path": "/spec/replicatedJobs/0/replicas", "value": 5}]
        _refused_by_policy(patch(more), policy)
        image = [
            {"op": "replace", "path": f"{template}/spec/containers/0/image", "value": "evil:1"}
        ]
        _refused_by_policy(patch(image), policy)
        mine = [{"op": "add", "path": "/metadata/labels/team", "value": "x"}]
        _refused_by_policy(patch(mine), policy)
    finally:
        request(accounts.api, "DELETE", f"{jobsets}/rbac-jobset")


def _pytorchjob(name: str) -> dict[str, Any]:
    """A PyTorchJob as Gantry's webhook holds it: suspended by its run policy, labelled held."""
    spec = {**copy.deepcopy(PROBE["spec"]), "restartPolicy": "Never"}
    replica = {"replicas": 1, "restartPolicy": "OnFailure", "template": {"spec": spec}}
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {HELD: "true"}},
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {"Master": replica, "Worker": copy.deepcopy(replica)},
        },
    }


@pytest.mark.kubernetes
def test_the_scheduler_patches_a_pytorchjob_only_to_admit_or_suspend_it(
    accounts: Accounts, policies: None
) -> None:
    """gantry-scheduler-workload-admission: the daemon's own admission patch (Gantry's labels
    on the Master's and Worker's templates, spec.runPolicy.suspend false) and its suspension
    pass; anything else is refused (the PyTorchJob CRD at training-operator v1.9.3; its
    operator and webhook are not running)."""
    scheduler = accounts.clients[SCHEDULER]
    path = f"/apis/kubeflow.org/v1/namespaces/{accounts.project}/pytorchjobs"
    made = request(accounts.api, "POST", path, body=_pytorchjob("rbac-pytorchjob"))
    assert made.status == 201, made.message
    try:

        def patch(ops: list[dict[str, Any]]) -> Answer:
            return request(
                scheduler,
                "PATCH",
                f"{path}/rbac-pytorchjob",
                body=ops,
                query=[("dryRun", "All")],
                content_type="application/json-patch+json",
            )

        admit = resume_patch(PYTORCHJOB, made.body, make_request(job_id=8))
        assert patch(admit).status == 200, patch(admit).message
        suspend = [{"op": "replace", "path": "/spec/runPolicy/suspend", "value": True}]
        assert patch(suspend).status == 200, patch(suspend).message
        policy = "gantry-scheduler-workload-admission"
        master = "/spec/pytorchReplicaSpecs/Master"
        theirs = [
            {"op": "add", "path": f"{master}/template/metadata", "value": {"labels": {"t": "x"}}}
        ]
        _refused_by_policy(patch(theirs), policy)
        more = [{"op": "replace", "path": "/spec/pytorchReplicaSpecs/Worker/replicas", "value": 5}]
        _refused_by_policy(patch(more), policy)
        image = [
            {
                "op": "replace",
                "path": f"{master}/template/spec/containers/0/image",
                "value": "evil:1",
            }
        ]
        _refused_by_policy(patch(image), policy)
        deadline = [{"op": "add", "path": "/spec/runPolicy/activeDeadlineSeconds", "value": 9}]
        _refused_by_policy(patch(deadline), policy)
    finally:
        request(accounts.api, "DELETE", f"{path}/rbac-pytorchjob")


@pytest.mark.kubernetes
def test_the_scheduler_creates_only_restricted_gantry_namespaces(
    accounts: Accounts, policies: None
) -> None:
    scheduler = accounts.clients[SCHEDULER]
    policy = "gantry-scheduler-project-namespaces"
    dry = [("dryRun", "All")]
    plain = {"metadata": {"name": "rbac-plain"}}
    _refused_by_policy(
        request(scheduler, "POST", "/api/v1/namespaces", body=plain, query=dry), policy
    )
    privileged = {
        "metadata": {
            "name": "rbac-privileged",
            "labels": {
                "app.kubernetes.io/managed-by": "gantry",
                "pod-security.kubernetes.io/enforce": "privileged",
            },
        }
    }
    answer = request(scheduler, "POST", "/api/v1/namespaces", body=privileged, query=dry)
    _refused_by_policy(answer, policy)


@pytest.mark.kubernetes
def test_the_scheduler_only_cordons_nodes(
    accounts: Accounts, policies: None, probe_node: str
) -> None:
    """nodes patch is for spec.unschedulable: relabelling or untainting a node (which would
    steer other workloads onto GPU nodes) is refused; the admin still may."""
    scheduler = accounts.clients[SCHEDULER]
    policy = "gantry-scheduler-cordon-only"
    merge = "application/merge-patch+json"
    path = f"/api/v1/nodes/{probe_node}"
    cordon = {"spec": {"unschedulable": True}}
    assert request(scheduler, "PATCH", path, body=cordon, content_type=merge).status == 200
    for change in ({"metadata": {"labels": {"x": "y"}}}, {"spec": {"taints": []}}):
        answer = request(scheduler, "PATCH", path, body=change, content_type=merge)
        _refused_by_policy(answer, policy)
    admin = request(
        accounts.api, "PATCH", path, body={"metadata": {"labels": {"x": "y"}}}, content_type=merge
    )
    assert admin.status == 200, admin


def _log_binding(subject: str = APP, role: str = "gantry-app-reader") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "rbac-probe-binding"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": NAMESPACE}],
    }


@pytest.mark.kubernetes
def test_the_scheduler_binds_the_log_reader_only_to_the_web_in_gantrys_namespaces(
    accounts: Accounts, policies: None
) -> None:
    """Its rolebindings create is cluster-wide: RBAC keeps it to the log reader's role (bind on
    that ClusterRole alone), the admission policies to the web's account and to Gantry's
    namespaces, so it cannot hand job logs, or more, to a tenant's account."""
    scheduler = accounts.clients[SCHEDULER]
    dry = [("dryRun", "All")]

    def bind(namespace: str, body: dict[str, Any]) -> Answer:
        path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings"
        return request(scheduler, "POST", path, body=body, query=dry)

    assert bind(accounts.project, _log_binding()).status == 201
    _refused_by_policy(
        bind(accounts.project, _log_binding(subject="default")), "gantry-scheduler-log-binding"
    )
    _refused_by_policy(bind(OTHER_NS, _log_binding()), "gantry-scheduler-namespaces")
    # Refused twice over: by the policy, and by RBAC's escalation check (bind on this role only).
    escalation = bind(accounts.project, _log_binding(role="gantry-scheduler"))
    _refused_by_policy(escalation, "gantry-scheduler-log-binding")
    assert not _access_review(
        accounts.api,
        username(SCHEDULER),
        Permission("rbac.authorization.k8s.io", "clusterroles", "bind", "gantry-scheduler"),
        None,
    )
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "rbac-probe-allow-all"},
        "spec": {"podSelector": {}, "ingress": [{}], "policyTypes": ["Ingress"]},
    }
    path = f"/apis/networking.k8s.io/v1/namespaces/{OTHER_NS}/networkpolicies"
    created = request(scheduler, "POST", path, body=policy, query=dry)
    _refused_by_policy(created, "gantry-scheduler-namespaces")


@pytest.mark.kubernetes
def test_the_workload_controller_writes_only_its_status_annotations(
    accounts: Accounts, policies: None
) -> None:
    """gantry-workloads-status (26-workload-status.yaml): the controller's account writes
    Gantry's two status annotations on a held Job (what `kubectl get -o custom-columns`
    shows), and nothing else: not a label, another annotation, or the Job's spec."""
    workloads = accounts.clients[WORKLOADS]
    jobs = f"/apis/batch/v1/namespaces/{accounts.project}/jobs"
    spec = {**copy.deepcopy(PROBE["spec"]), "restartPolicy": "Never"}
    body = {
        "metadata": {"name": "rbac-status", "labels": {HELD: "true"}, "annotations": {"a": "b"}},
        "spec": {"suspend": True, "template": {"spec": spec}},
    }
    made = request(accounts.api, "POST", jobs, body=body)
    assert made.status == 201, made.message
    try:
        backend, _ = _backend(workloads)
        about = ("batch/v1", "Job", made.body["metadata"]["uid"])
        backend.annotate(
            accounts.project, "rbac-status", about, status_annotations("Queued", "why")
        )
        read = request(accounts.api, "GET", f"{jobs}/rbac-status").body
        assert read["metadata"]["annotations"] == {
            "a": "b",
            "gantry.io/status": "Queued",
            "gantry.io/reason": "why",
        }

        def patch(change: dict[str, Any]) -> Answer:
            return request(
                workloads,
                "PATCH",
                f"{jobs}/rbac-status",
                body=change,
                query=[("dryRun", "All")],
                content_type="application/merge-patch+json",
            )

        policy = "gantry-workloads-status"
        deadline = time.monotonic() + WAIT_S  # a new policy takes effect a moment later
        while (label := patch({"metadata": {"labels": {"team": "x"}}})).status != 403:
            assert time.monotonic() < deadline, f"{policy} never applied: {label}"
            time.sleep(0.2)
        _refused_by_policy(label, policy)
        _refused_by_policy(patch({"metadata": {"annotations": {"a": "c"}}}), policy)
        _refused_by_policy(patch({"spec": {"suspend": False}}), policy)
        _refused_by_policy(patch({"spec": {"backoffLimit": 100}}), policy)
        mine = patch({"metadata": {"annotations": {"gantry.io/status": "Admitted"}}})
        assert mine.status == 200, mine.message
    finally:
        request(accounts.api, "DELETE", f"{jobs}/rbac-status")
