"""What each of Gantry's service accounts must and must not be allowed to do in the cluster.

The single source of truth for platform/k8s/02-rbac.yaml: tests/k8s/test_rbac_real.py checks
every row against the real API server (SubjectAccessReview, and real calls with each account's
own token), that the roles grant nothing beyond MUST (SelfSubjectRulesReview), and that every
client method the Kubernetes backend calls maps to a row here (CLIENT_METHODS), so a new call
without its permission fails a test before it fails in a cluster. tests/test_platform.py reads
the manifests against the same table. The table is documented in platform/k8s/README.md.

Pure data: it imports neither Django nor the project.
"""

from __future__ import annotations

from typing import NamedTuple

NAMESPACE = "gantry-system"
SCHEDULER = "gantry-scheduler"  # the scheduler daemon
APP = "gantry-app"  # the web
WORKER = "gantry-worker"  # worker and beat: they never call the Kubernetes API
AGENT = "gantry-node-agent"  # the node agent (reports over Gantry's API, not Kubernetes')
MIGRATE = "gantry-migrate"  # the migrate job
WORKLOADS = "gantry-workloads"  # the workload controller (issue 37)
ACCOUNTS = (SCHEDULER, APP, WORKER, AGENT, MIGRATE, WORKLOADS)
LOG_READER = "gantry-app-reader"  # the ClusterRole the daemon binds in each project namespace

# A project's namespace (where job pods live) and the cluster's own: a cluster-wide grant
# reaches both, a missing one neither.
TENANT_NS = "team-a-vision"
OTHER_NS = "kube-system"


class Permission(NamedTuple):
    group: str  # "" is the core group
    resource: str  # "pods/log" for a subresource
    verb: str
    name: str = ""  # one object only (a rule's resourceNames); "" for any

    def __str__(self) -> str:
        named = f" {self.name}" if self.name else ""
        return f"{self.verb} {self.group or 'core'}/{self.resource}{named}"


def _perms(group: str, resource: str, *verbs: str, name: str = "") -> set[Permission]:
    return {Permission(group, resource, verb, name) for verb in verbs}


RBAC = "rbac.authorization.k8s.io"
# The web's log RoleBinding in a project namespace: creating one that names a ClusterRole takes
# `bind` on that role (the API server's escalation check), granted for this role only.
_LOG_BINDING = _perms(RBAC, "rolebindings", "create") | _perms(
    RBAC, "clusterroles", "bind", name=LOG_READER
)


# The custom kinds Gantry resumes (scheduler/backends/workloads.py: RESUMABLE, less batch's Job).
RESUMED = (
    ("jobset.x-k8s.io", "jobsets"),
    ("ray.io", "rayjobs"),
    ("trainer.kubeflow.org", "trainjobs"),
    ("kubeflow.org", "pytorchjobs"),
)


def _resumed(*verbs: str) -> set[Permission]:
    return {p for group, plural in RESUMED for p in _perms(group, plural, *verbs)}


# The Kubernetes client methods the backend calls (scheduler/backends/kubernetes/*.py), each
# with what the API server authorizes for it. The list methods also open the watches (watch=True).
CLIENT_METHODS: dict[str, set[Permission]] = {
    "create_namespaced_pod": _perms("", "pods", "create"),
    "read_namespaced_pod": _perms("", "pods", "get"),
    "patch_namespaced_pod": _perms("", "pods", "patch"),  # admits a held pod (issue 37)
    # A Job a user created (issue 37): read, admitted and suspended by the daemon, listed by
    # the workload controller.
    "read_namespaced_job": _perms("batch", "jobs", "get"),
    "patch_namespaced_job": _perms("batch", "jobs", "patch"),
    "list_job_for_all_namespaces": _perms("batch", "jobs", "list", "watch"),
    # The other kinds users create (issue 37), through the custom objects API: a JobSet,
    # RayJob, TrainJob or PyTorchJob read, admitted and suspended by the daemon; those and
    # LWSs listed by the workload controller.
    "get_namespaced_custom_object": _resumed("get"),
    "patch_namespaced_custom_object": _resumed("patch"),
    "list_cluster_custom_object": _resumed("list", "watch")
    | _perms("leaderworkerset.x-k8s.io", "leaderworkersets", "list", "watch"),
    # A TrainJob's runtime, read by the workload controller (its initializers count).
    "get_cluster_custom_object": _perms("trainer.kubeflow.org", "clustertrainingruntimes", "get"),
    "list_namespaced_custom_object": _perms("trainer.kubeflow.org", "trainingruntimes", "list"),
    "delete_namespaced_pod": _perms("", "pods", "delete"),
    "list_pod_for_all_namespaces": _perms("", "pods", "list", "watch"),
    "create_namespaced_pod_binding": _perms("", "pods/binding", "create"),
    "read_namespaced_pod_log": _perms("", "pods/log", "get"),
    "list_node": _perms("", "nodes", "list", "watch"),
    "read_node": _perms("", "nodes", "get"),
    "patch_node": _perms("", "nodes", "patch"),  # cordon / uncordon
    "create_namespaced_service": _perms("", "services", "create"),
    "read_namespace": _perms("", "namespaces", "get"),
    "create_namespace": _perms("", "namespaces", "create"),
    "create_namespaced_event": _perms("", "events", "create"),
    "create_namespaced_network_policy": _perms("networking.k8s.io", "networkpolicies", "create"),
    "create_namespaced_role_binding": _LOG_BINDING,
}
# The client methods the web calls outside the backend: the node agent's TokenReview
# (scheduler/nodes/agent_auth.py).
WEB_CLIENT_METHODS: dict[str, set[Permission]] = {
    "create_token_review": _perms("authentication.k8s.io", "tokenreviews", "create"),
}
# The backend's methods the web process calls (the LogSource protocol: job logs); the daemon
# calls every other one.
WEB_METHODS = frozenset({"read_log", "follow_log"})

# What each account MUST be able to do, cluster-wide (project namespaces are made at run time,
# so a namespaced Role cannot follow them), but for PROJECT_ONLY. Exactly this: the roles grant
# nothing more.
MUST: dict[str, set[Permission]] = {
    SCHEDULER: (
        _perms("", "pods", "create", "get", "list", "watch", "delete", "patch")
        | _perms("", "pods/binding", "create")
        # list: reconcile's sweep of held objects (scheduler/daemon/strays.py)
        | _perms("batch", "jobs", "get", "list", "watch", "patch")
        | _resumed("get", "list", "watch", "patch")
        # the sweep's method (list_cluster_custom_object) reads these too; it never lists them
        | _perms("leaderworkerset.x-k8s.io", "leaderworkersets", "list", "watch")
        | _perms("", "nodes", "get", "list", "watch", "patch")
        | _perms("", "services", "create")
        | _perms("", "namespaces", "get", "create")
        | _perms("", "events", "create")
        | _perms("networking.k8s.io", "networkpolicies", "create")
        | _LOG_BINDING
    ),
    APP: _perms("", "pods/log", "get") | _perms("authentication.k8s.io", "tokenreviews", "create"),
    WORKER: set(),
    AGENT: set(),
    MIGRATE: set(),
    # Reads (watches) the held objects, tells their users in events and in two status
    # annotations on each (patch, held to those by 26-workload-status.yaml).
    WORKLOADS: _perms("", "pods", "list", "watch", "patch")
    | _perms("batch", "jobs", "list", "watch", "patch")
    | _resumed("list", "watch", "patch")
    | _perms("leaderworkerset.x-k8s.io", "leaderworkersets", "list", "watch")
    | _perms("trainer.kubeflow.org", "clustertrainingruntimes", "get")
    | _perms("trainer.kubeflow.org", "trainingruntimes", "list")
    | _perms("", "events", "create"),
}
# Held in project namespaces only, through the RoleBinding the daemon creates with each one:
# not in Gantry's own namespace, nor in kube-system.
PROJECT_ONLY: dict[str, set[Permission]] = {APP: _perms("", "pods/log", "get")}

# What no Gantry account may do: read secrets, run commands in or talk to pods, remove or
# rewrite nodes, namespaces and workloads, mint tokens, impersonate, or grant itself more.
_NOBODY: set[Permission] = (
    _perms("", "secrets", "get", "list", "watch", "create")
    | _perms("", "pods/exec", "create", "get")
    | _perms("", "pods/attach", "create")
    | _perms("", "pods/portforward", "create")
    | _perms("", "pods/proxy", "get", "create")
    | _perms("", "pods/ephemeralcontainers", "patch")
    | _perms("", "pods", "deletecollection", "update")
    | _perms("", "pods/status", "patch", "update")
    | _perms("", "pods/eviction", "create")
    | _perms("", "nodes", "delete", "create", "update", "deletecollection")
    | _perms("", "nodes/proxy", "get")
    | _perms("", "nodes/status", "patch")
    | _perms("", "namespaces", "delete", "update", "patch")
    | _perms("", "serviceaccounts/token", "create")
    | _perms("", "serviceaccounts", "impersonate")
    | _perms("", "users", "impersonate")
    | _perms("", "groups", "impersonate")
    | _perms("", "configmaps", "get", "update")
    | _perms("", "persistentvolumes", "create", "delete")
    | _perms("apps", "deployments", "create", "patch", "delete")
    | _perms("apps", "daemonsets", "create", "patch")
    | _perms("batch", "jobs", "create")
    | _perms("rbac.authorization.k8s.io", "clusterroles", "escalate", "bind", "create")
    | _perms("rbac.authorization.k8s.io", "roles", "escalate", "bind", "create")
    | _perms("rbac.authorization.k8s.io", "clusterrolebindings", "create")
    | _perms("rbac.authorization.k8s.io", "rolebindings", "create")
    | _perms("certificates.k8s.io", "certificatesigningrequests", "create")
    | _perms("admissionregistration.k8s.io", "validatingwebhookconfigurations", "create")
)
# MUST NOT: the common list, and per account what it could be tempted to hold but does not need
# (the scheduler's writes it never makes; reads the web process does not do).
MUST_NOT: dict[str, set[Permission]] = {
    # Its rolebindings create is MUST (the log binding; 04-admission.yaml holds it to that).
    SCHEDULER: (_NOBODY - _perms(RBAC, "rolebindings", "create"))
    | _perms("", "pods/log", "get")
    | _perms(RBAC, "roles", "bind", name=LOG_READER)
    | _perms("networking.k8s.io", "networkpolicies", "delete", "patch", "update")
    | _perms("", "services", "delete", "update", "patch", "list")
    | _perms("", "namespaces", "list", "watch")
    | _perms("", "events", "patch", "delete")
    | _perms("events.k8s.io", "events", "create", "patch"),
    APP: _NOBODY
    | _perms("", "pods", "get", "list", "watch", "create", "delete", "patch")
    | _perms("", "pods/binding", "create")
    | _perms("", "nodes", "get", "list", "patch")
    | _perms("", "namespaces", "get", "list", "create")
    | _perms("", "services", "create")
    | _perms("", "events", "list", "create"),
    WORKER: _NOBODY
    | _perms("", "pods/log", "get")
    | _perms("", "pods", "get", "list", "patch")
    | _perms("authentication.k8s.io", "tokenreviews", "create"),
    AGENT: _NOBODY
    | _perms("", "pods", "get", "list", "watch", "patch")
    | _perms("", "pods/log", "get")
    | _perms("", "nodes", "get", "list", "patch"),
    MIGRATE: _NOBODY | _perms("", "pods", "get", "list", "patch") | _perms("", "nodes", "list"),
    # It reads and tells; the daemon admits. (Its patches write Gantry's status annotations
    # only: 26-workload-status.yaml.)
    WORKLOADS: _NOBODY
    | _perms("", "pods", "get", "create", "delete", "update")
    | _perms("batch", "jobs", "get", "create", "update", "delete")
    | _resumed("get", "create", "update", "delete")
    | _perms("leaderworkerset.x-k8s.io", "leaderworkersets", "get", "patch", "delete")
    | _perms("", "pods/binding", "create")
    | _perms("", "pods/log", "get")
    | _perms("", "nodes", "get", "list", "patch")
    | _perms("", "namespaces", "get", "create")
    | _perms("", "events", "list", "patch", "delete"),
}

CLUSTER_SCOPED = frozenset(
    {
        "nodes",
        "nodes/proxy",
        "nodes/status",
        "namespaces",
        "persistentvolumes",
        "users",
        "groups",
        "clusterroles",
        "clusterrolebindings",
        "certificatesigningrequests",
        "validatingwebhookconfigurations",
        "tokenreviews",
    }
)


def namespaces_of(
    permission: Permission, account: str = "", project: str = TENANT_NS
) -> tuple[str | None, ...]:
    """Where a MUST row is checked: cluster-wide, or in a project's namespace, Gantry's own and
    the cluster's (kube-system); a PROJECT_ONLY row in the project's namespace alone."""
    if permission.resource in CLUSTER_SCOPED:
        return (None,)
    if permission in PROJECT_ONLY.get(account, ()):
        return (project,)
    return (project, NAMESPACE, OTHER_NS)


def username(account: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{account}"
