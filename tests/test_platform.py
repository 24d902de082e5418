"""The deployment files: platform/ (Dockerfile, Kubernetes manifests) and docker-compose.yml.

These tests read files only. They import neither Django nor the project, so they run without
settings: `pytest tests/test_platform.py -p no:django`. Whether a process's command exists is
judged from the repository: `manage.py X` needs a `*/management/commands/X.py` (in the repository
or in Django's own commands), `celery -A config` needs `config/celery.py`, and
`gunicorn config.wsgi:application` needs `config/wsgi.py` defining `application`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
import shlex
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.k8s.rbac_table import MUST, SCHEDULER

ROOT = Path(__file__).resolve().parent.parent
PLATFORM = ROOT / "platform"
K8S = PLATFORM / "k8s"
DOCKERFILE = PLATFORM / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
DOCKERIGNORE = ROOT / ".dockerignore"
DEPLOYMENT_DOC = ROOT / "docs" / "deployment.md"

K8S_VERSION = "1.30"
NAMESPACE = "gantry-system"

# The environment the settings read (config/settings.py), and nothing else.
SETTINGS_ENV = {
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_SECRET_KEY",
    "DJANGO_DEBUG",
    "DJANGO_ALLOWED_HOSTS",
    "DJANGO_CSRF_TRUSTED_ORIGINS",
    "GANTRY_PRODUCTION",
    "GANTRY_CLUSTER_BACKEND",
    "KUBECONFIG",
    "GANTRY_SCHEDULER_INTERVAL_S",
    "GANTRY_SEED_DEMO",
    "GANTRY_TRUSTED_PROXIES",
    "GANTRY_BASE_URL",
}
# Set for the process rather than for the settings: a writable HOME on a read-only filesystem.
PROCESS_ENV = {"HOME"}


PROJECT_PACKAGES = ("config", "common", "tenants", "scheduler", "billing")


@cache
def env_read_by_project() -> frozenset[str]:
    """Every upper-case string literal in the project's packages: the environment variables the
    code can read (with KUBECONFIG, which the kubernetes client reads itself)."""
    names = {"KUBECONFIG"}
    for package in PROJECT_PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            names.update(re.findall(r"[\"']([A-Z][A-Z0-9_]{2,})[\"']", path.read_text()))
    return frozenset(names)


COMPOSE_SERVICES = {"postgres", "redis", "migrate", "web", "scheduler", "worker", "beat"}
COMPOSE_APP_SERVICES = COMPOSE_SERVICES - {"postgres", "redis"}

PRIORITY_CLASSES = ["critical", "high", "normal", "low", "best-effort"]

# Directories never searched for management commands.
_NOT_SOURCE = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}


# --------------------------------------------------------------------------------------------
# Does a command exist? (shared by compose, the Kubernetes workloads and the Dockerfile)


@cache
def _django_dir() -> Path | None:
    # find_spec on a top-level name locates the package without importing it.
    spec = importlib.util.find_spec("django")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


@cache
def management_command_files(name: str) -> tuple[Path, ...]:
    """Every `management/commands/<name>.py`: the repository's apps, then Django's own."""
    found: list[Path] = []
    for top in sorted(ROOT.iterdir()):
        if top.is_dir() and top.name not in _NOT_SOURCE and not top.name.startswith("."):
            found.extend(
                p
                for p in top.rglob(f"management/commands/{name}.py")
                if not _NOT_SOURCE.intersection(p.relative_to(ROOT).parts)
            )
    django_dir = _django_dir()
    if django_dir is not None:
        found.extend(django_dir.rglob(f"management/commands/{name}.py"))
    return tuple(found)


def _argv(command: Any) -> list[str]:
    if isinstance(command, str):
        return shlex.split(command)
    assert isinstance(command, list), f"a command is a string or a list, not {command!r}"
    return [str(part) for part in command]


def _manage_py_problems(args: list[str]) -> list[str]:
    problems = []
    if not (ROOT / "manage.py").is_file():
        problems.append("manage.py is missing at the repository root")
    if not args or args[0].startswith("-"):
        return [*problems, "manage.py without a command"]
    name = args[0]
    if not management_command_files(name):
        problems.append(
            f"manage.py {name}: no */management/commands/{name}.py in the repository or Django"
        )
    return problems


def _celery_problems(args: list[str]) -> list[str]:
    app = None
    for i, arg in enumerate(args):
        if arg in ("-A", "--app") and i + 1 < len(args):
            app = args[i + 1]
        elif arg.startswith("--app="):
            app = arg.split("=", 1)[1]
    if app is None:
        return ["celery without -A/--app"]
    module = app.split(":", 1)[0]
    base = ROOT.joinpath(*module.split("."))
    # `celery -A config` loads config.celery (or the module itself when it holds the app).
    if not ((base / "celery.py").is_file() or base.with_suffix(".py").is_file()):
        return [f"celery -A {app}: neither {module.replace('.', '/')}/celery.py nor a module"]
    subcommands = [a for a in args if not a.startswith("-")]
    if not {"worker", "beat"}.intersection(subcommands):
        return [f"celery -A {app}: runs neither worker nor beat ({args})"]
    return []


def _gunicorn_problems(args: list[str]) -> list[str]:
    targets = [a for a in args if re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", a)]
    if len(targets) != 1:
        return [f"gunicorn needs exactly one module:application argument, got {args}"]
    module, attr = targets[0].split(":")
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    if not path.is_file():
        return [f"gunicorn {targets[0]}: {path.relative_to(ROOT)} is missing"]
    if not re.search(rf"^{re.escape(attr)}\s*[:=]", path.read_text(), re.MULTILINE):
        return [f"gunicorn {targets[0]}: {path.relative_to(ROOT)} defines no {attr}"]
    return []


def command_problems(command: Any) -> list[str]:
    """What keeps this Gantry process's command from starting; empty when nothing does."""
    argv = _argv(command)
    if not argv:
        return ["empty command"]
    exe = Path(argv[0]).name
    if exe in ("sh", "bash") and len(argv) >= 3 and argv[1] == "-c":
        # A shell loop around manage.py (the init containers that wait for migrations).
        invocations = re.findall(r"manage\.py\s+([\w-]+)", argv[2])
        if not invocations:
            return [f"shell command runs no manage.py command: {argv[2]!r}"]
        return [p for name in invocations for p in _manage_py_problems([name])]
    if re.fullmatch(r"python(3(\.\d+)?)?", exe) and len(argv) >= 2 and argv[1] == "manage.py":
        return _manage_py_problems(argv[2:])
    if exe == "celery":
        return _celery_problems(argv[1:])
    if exe == "gunicorn":
        return _gunicorn_problems(argv[1:])
    return [f"not a Gantry process command: {argv}"]


def test_command_checker_rejects_what_does_not_exist() -> None:
    """The checker is not a rubber stamp."""
    assert command_problems(["python", "manage.py", "no_such_command_xyz"])
    assert command_problems(["celery", "-A", "no_such_package_xyz", "worker"])
    assert command_problems(["gunicorn", "no_such_package_xyz.wsgi:application"])
    assert command_problems(["sleep", "infinity"])
    # Django's own commands count as commands without importing Django.
    assert management_command_files("migrate")
    assert management_command_files("collectstatic")


# --------------------------------------------------------------------------------------------
# (a) platform/ is not a Python package


def test_platform_holds_no_python() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in PLATFORM.rglob("*")
        if p.suffix in (".py", ".pyc", ".pyi", ".pyx") or p.name.startswith("__init__")
    ]
    assert not offenders, (
        f"platform/ must hold deployment files only: a package named platform shadows the "
        f"standard library; remove {offenders}"
    )


def test_platform_still_means_the_standard_library() -> None:
    import platform

    origin = Path(platform.__file__ or "").resolve()
    assert PLATFORM.resolve() not in origin.parents, origin
    assert callable(platform.python_version)


# --------------------------------------------------------------------------------------------
# (b) Kubernetes manifests


def _manifest_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml", ".json"))


def _load_manifests() -> list[tuple[str, int, dict[str, Any]]]:
    loaded = []
    for path in _manifest_files():
        text = path.read_text()
        docs = [json.loads(text)] if path.suffix == ".json" else yaml.safe_load_all(text)
        for index, doc in enumerate(d for d in docs if d is not None):
            loaded.append((str(path.relative_to(ROOT)), index, doc))
    return loaded


MANIFESTS = _load_manifests()


def _id(entry: tuple[str, int, dict[str, Any]]) -> str:
    path, index, doc = entry
    return f"{path}#{index}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def _docs(kind: str | None = None, *, applied_only: bool = False) -> list[dict[str, Any]]:
    return [
        doc
        for path, _, doc in MANIFESTS
        if (kind is None or doc.get("kind") == kind)
        and (not applied_only or Path(path).parent == K8S.relative_to(ROOT))
    ]


def _one(kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in _docs(kind) if d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind} {name}, found {len(matches)}"
    return matches[0]


WORKLOAD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    if doc["kind"] == "CronJob":
        return doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


WORKLOADS = [d for d in _docs() if d.get("kind") in WORKLOAD_KINDS]


def _wid(doc: dict[str, Any]) -> str:
    return f"{doc['kind']}/{doc['metadata']['name']}"


def test_manifests_exist() -> None:
    kinds = {d["kind"] for d in _docs()}
    expected = {
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "PriorityClass",
        "ConfigMap", "Secret", "Deployment", "Service", "DaemonSet", "Job",
    }  # fmt: skip
    assert expected <= kinds, f"missing kinds: {expected - kinds}"


@pytest.mark.parametrize("entry", MANIFESTS, ids=_id)
def test_manifest_validates_offline(entry: tuple[str, int, dict[str, Any]]) -> None:
    _, _, doc = entry
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validation_catches_a_misspelt_field() -> None:
    """The offline validator really checks (strict mode rejects unknown fields)."""
    deployment = copy.deepcopy(_one("Deployment", "gantry-scheduler"))
    deployment["spec"]["replcas"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_kubectl_apply_order_and_namespaces() -> None:
    """`kubectl apply -f platform/k8s/` reads the top-level files in name order."""
    top = sorted(p for p in K8S.iterdir() if p.suffix in (".yaml", ".yml", ".json"))
    assert top, "no manifests directly under platform/k8s/"
    first = [d for d in yaml.safe_load_all(top[0].read_text()) if d]
    assert first[0]["kind"] == "Namespace" and first[0]["metadata"]["name"] == NAMESPACE
    assert not (K8S / "kustomization.yaml").exists(), "kubectl apply -f would choke on it"
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "PriorityClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration",
    }
    for doc in _docs(applied_only=True):
        if doc["kind"] not in cluster_scoped:
            assert doc["metadata"].get("namespace") == NAMESPACE, _wid(doc)


def test_priority_classes() -> None:
    values = []
    for name in PRIORITY_CLASSES:
        pc = _one("PriorityClass", f"gantry-{name}")
        assert pc.get("globalDefault", False) is False
        values.append(pc["value"])
        # As seeded: low and best-effort may not preempt.
        expected_policy = "Never" if name in ("low", "best-effort") else "PreemptLowerPriority"
        assert pc.get("preemptionPolicy", "PreemptLowerPriority") == expected_policy, name
    assert values == sorted(values, reverse=True) and len(set(values)) == len(values), values
    platform_class = _one("PriorityClass", "gantry-platform")
    assert platform_class["value"] > values[0], "Gantry's own pods outrank every job"
    assert platform_class["preemptionPolicy"] == "Never", "only Gantry preempts Gantry's jobs"
    for doc in WORKLOADS:
        assert _pod_spec(doc).get("priorityClassName") == "gantry-platform", _wid(doc)


def _rules_allow(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    return any(
        group in r.get("apiGroups", [])
        and (resource in r.get("resources", []) or "*" in r.get("resources", []))
        and (verb in r.get("verbs", []) or "*" in r.get("verbs", []))
        for r in rules
    )


# What the daemon's calls need: the RBAC table (tests/k8s/rbac_table.py, checked against the
# backend's code and the real API server by tests/k8s/test_rbac_real.py).
SCHEDULER_NEEDS = [(p.group, p.resource, [p.verb]) for p in sorted(MUST[SCHEDULER])]


def test_scheduler_rbac() -> None:
    role = _one("ClusterRole", "gantry-scheduler")
    missing = [
        f"{group or 'core'}/{resource}:{verb}"
        for group, resource, verbs in SCHEDULER_NEEDS
        for verb in verbs
        if not _rules_allow(role["rules"], group, resource, verb)
    ]
    assert not missing, f"the scheduler's ClusterRole lacks {missing}"
    assert not any("*" in r.get("verbs", []) + r.get("resources", []) for r in role["rules"])
    binding = _one("ClusterRoleBinding", "gantry-scheduler")
    assert binding["roleRef"]["name"] == "gantry-scheduler"
    assert {"kind": "ServiceAccount", "name": "gantry-scheduler", "namespace": NAMESPACE} in (
        binding["subjects"]
    )
    _one("ServiceAccount", "gantry-scheduler")
    deployment = _one("Deployment", "gantry-scheduler")
    assert _pod_spec(deployment)["serviceAccountName"] == "gantry-scheduler"


def test_the_web_may_read_job_pods_logs_in_project_namespaces_only() -> None:
    """The job page, the logs API and `gantry logs` read pods/log from the web process: through
    the RoleBinding the daemon makes in each project namespace, never cluster-wide (issue 34)."""
    (binding,) = [d for d in _docs("RoleBinding") if d["roleRef"]["name"] == "gantry-app-reader"]
    assert binding["metadata"]["namespace"] == "team-a-vision"  # the project's template
    role = _one("ClusterRole", binding["roleRef"]["name"])
    assert _rules_allow(role["rules"], "", "pods/log", "get")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gantry-app", "namespace": NAMESPACE}
    ]
    cluster_wide = [b["metadata"]["name"] for b in _docs("ClusterRoleBinding")]
    assert not [b for b in cluster_wide if _one("ClusterRole", b) is role], cluster_wide
    assert _pod_spec(_one("Deployment", "gantry-web"))["serviceAccountName"] == "gantry-app"


def test_the_tenant_template_is_what_the_daemon_creates() -> None:
    """templates/tenant-namespace.yaml shows an operator what each project namespace holds;
    the daemon renders the same NetworkPolicies and RoleBinding (kubernetes_namespace)."""
    from scheduler.backends.kubernetes.config import KubernetesConfig
    from scheduler.backends.kubernetes.namespaces import (
        render_log_reader_binding,
        render_network_policies,
    )

    config = KubernetesConfig()
    rendered = [*render_network_policies("team-a-vision", config)]
    rendered.append(render_log_reader_binding("team-a-vision", config))
    template = [
        doc
        for path, _, doc in MANIFESTS
        if path.endswith("tenant-namespace.yaml") and doc["kind"] != "Namespace"
    ]
    assert template == rendered


def test_worker_and_beat_hold_no_kubernetes_token() -> None:
    """They never call the Kubernetes API (logs and TokenReviews are the web's): an account
    without rights, and no token mounted (issue 34)."""
    for name in ("gantry-worker", "gantry-beat"):
        pod = _pod_spec(_one("Deployment", name))
        assert pod["serviceAccountName"] == "gantry-worker", name
        assert pod["automountServiceAccountToken"] is False, name
    bound = {
        s["name"] for b in _docs("ClusterRoleBinding") + _docs("RoleBinding") for s in b["subjects"]
    }
    assert "gantry-worker" not in bound


def test_only_the_scheduler_may_change_the_cluster() -> None:
    writes = {"create", "update", "patch", "delete", "deletecollection", "*"}
    # A TokenReview is a question to the API server (who holds this token?), and an Event a
    # note to a user (the workload controller's), not changes.
    notes = (["tokenreviews"], ["events"])
    # The workload controller's patch of what it queues writes Gantry's two status
    # annotations and nothing else (issue 37): the policy below holds it to them.
    status = {"pods", "jobs", "jobsets", "rayjobs", "trainjobs", "pytorchjobs"}
    for binding in _docs("ClusterRoleBinding") + _docs("RoleBinding"):
        role = _one(binding["roleRef"]["kind"], binding["roleRef"]["name"])
        name = role["metadata"]["name"]
        if name != "gantry-scheduler":
            granted = {
                v
                for r in role["rules"]
                if r["resources"] not in notes
                for v in r["verbs"]
                if not (
                    name == "gantry-workloads" and v == "patch" and set(r["resources"]) <= status
                )
            }
            assert not granted & writes, f"{name} may write: {granted}"
    policy = _one("ValidatingAdmissionPolicy", "gantry-workloads-status")["spec"]
    held = {
        res for rule in policy["matchConstraints"]["resourceRules"] for res in rule["resources"]
    }
    assert held == status and "gantry-workloads" in policy["matchConditions"][0]["expression"]
    assert _one("ValidatingAdmissionPolicyBinding", "gantry-workloads-status")["spec"][
        "validationActions"
    ] == ["Deny"]
    workloads = _one("ClusterRole", "gantry-workloads")["rules"]
    assert [(r["resources"], r["verbs"]) for r in workloads if r["resources"] == ["events"]] == [
        (["events"], ["create"])
    ]


def test_scheduler_deployment() -> None:
    deployment = _one("Deployment", "gantry-scheduler")
    assert deployment["spec"]["replicas"] == 2, "leader plus hot standby"
    pod = _pod_spec(deployment)
    assert pod["affinity"]["podAntiAffinity"], "the two replicas belong on different nodes"
    (container,) = pod["containers"]
    assert container["readinessProbe"]
    assert container["command"][-1] == "run_scheduler"
    assert pod["terminationGracePeriodSeconds"] >= 30, "SIGTERM finishes the current cycle"


def test_the_scheduler_runs_the_profile_of_its_configmap() -> None:
    """The shipped profile is valid, and the daemon reads it where the ConfigMap is mounted."""
    from scheduler.profiles.files import parse_profile

    pod = _pod_spec(_one("Deployment", "gantry-scheduler"))
    (container,) = pod["containers"]
    path = next(e["value"] for e in container["env"] if e["name"] == "GANTRY_SCHEDULER_PROFILE")
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = _one("ConfigMap", volume["configMap"]["name"])
    key = path.removeprefix(mount["mountPath"] + "/")
    assert parse_profile(configmap["data"][key].encode()).name == "default"


def test_web_deployment_and_service() -> None:
    deployment = _one("Deployment", "gantry-web")
    pod = _pod_spec(deployment)
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert 8000 in [p["containerPort"] for p in container["ports"]]
    service = _one("Service", "gantry-web")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_beat_runs_once() -> None:
    beat = _one("Deployment", "gantry-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate", "an upgrade must not run two beats"


def test_node_agent_daemonset() -> None:
    agent = _one("DaemonSet", "gantry-node-agent")
    pod = _pod_spec(agent)
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in (
        pod["tolerations"]
    ) or {
        "key": "nvidia.com/gpu",
        "operator": "Equal",
        "value": "present",
        "effect": "NoSchedule",
    } in pod["tolerations"]
    placement = json.dumps([pod.get("nodeSelector"), pod.get("affinity")])
    assert "nvidia.com/gpu" in placement, "the agent belongs on GPU nodes only"
    for container in _containers(pod):
        resources = container.get("resources", {})
        for section in ("requests", "limits"):
            assert not any(k.startswith("nvidia.com/") for k in resources.get(section, {})), (
                "the node agent must not take GPUs away from jobs"
            )
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env.get("NVIDIA_VISIBLE_DEVICES") == "all"
    assert container["command"][-1] == "run_node_agent"


@pytest.mark.parametrize("doc", WORKLOADS, ids=_wid)
def test_workload_security(doc: dict[str, Any]) -> None:
    pod = _pod_spec(doc)
    context = pod.get("securityContext", {})
    assert context.get("runAsNonRoot") is True
    assert context.get("seccompProfile", {}).get("type") == "RuntimeDefault"
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not pod.get(host), host
    assert not any("hostPath" in v for v in pod.get("volumes", []))
    for container in _containers(pod):
        sc = container.get("securityContext", {})
        name = container["name"]
        assert sc.get("privileged", False) is False, name
        assert sc.get("allowPrivilegeEscalation") is False, name
        assert sc.get("readOnlyRootFilesystem") is True, name
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], name
        assert not sc.get("capabilities", {}).get("add"), name
        assert "memory" in container.get("resources", {}).get("limits", {}), name


def _gantry_containers() -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{_wid(doc)}/{c['name']}", c) for doc in WORKLOADS for c in _containers(_pod_spec(doc))
    ]


def test_workloads_share_one_image() -> None:
    images = {c["image"] for _, c in _gantry_containers()}
    assert len(images) == 1, f"every Gantry process runs the one image: {images}"


@pytest.mark.parametrize(
    ("name", "container"), [pytest.param(n, c, id=n) for n, c in _gantry_containers()]
)
def test_workload_command_exists(name: str, container: dict[str, Any]) -> None:
    command = container.get("command", []) + container.get("args", [])
    problems = command_problems(command)
    assert not problems, f"{name}: {problems}"


def test_workload_environment() -> None:
    config = _one("ConfigMap", "gantry-config")
    secret = _one("Secret", "gantry-secrets")
    assert set(config["data"]) <= env_read_by_project(), set(config["data"]) - env_read_by_project()
    assert "KUBECONFIG" not in config["data"], "in the cluster the client uses the service account"
    assert set(secret["stringData"]) == {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"}
    assert not set(secret["stringData"]) & set(config["data"])
    for name, container in _gantry_containers():
        refs = {
            (key, source[key]["name"])
            for source in container.get("envFrom", [])
            for key in ("configMapRef", "secretRef")
            if key in source
        }
        if "node-agent" in name:
            # GPU nodes get no database credentials: only the agent's own API token.
            assert refs == {("configMapRef", "gantry-config")}, name
            # A credential the pod cannot choose (issue 34, item 6): its projected
            # service-account token, for Gantry's audience, which the web verifies.
            env = {e["name"]: e for e in container["env"]}
            assert not {"GANTRY_AGENT_TOKEN", "GANTRY_AGENT_TOKEN_FILE"} & set(env), name
            path = env["GANTRY_AGENT_SA_TOKEN_FILE"]["value"]
            (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"])]
            pod = _pod_spec(_one("DaemonSet", "gantry-node-agent"))
            volumes = {v["name"]: v for v in pod["volumes"]}
            (source,) = volumes[mount["name"]]["projected"]["sources"]
            token = source["serviceAccountToken"]
            assert token["audience"] == "gantry-agent"
            assert path == f"{mount['mountPath']}/{token['path']}"
            assert token["expirationSeconds"] <= 3600
            assert not any("secret" in v for v in pod["volumes"]), "no Secret of node tokens"
            continue
        if "webhook" in name:
            # The admission webhook decides from the request alone (issue 37): no database.
            assert refs == {("configMapRef", "gantry-config")}, name
            continue
        assert refs == {("configMapRef", "gantry-config"), ("secretRef", "gantry-secrets")}, name


def test_no_secret_of_node_agent_tokens_is_shipped() -> None:
    """Every agent pod mounted the whole Secret of per-node tokens (issue 34, item 6): on
    Kubernetes the agents need none."""
    assert not [d for d in _docs("Secret") if d["metadata"]["name"] == "gantry-node-agent"]


def test_config_trusts_no_proxy_until_the_ingress_is_named() -> None:
    """Any peer listed in GANTRY_TRUSTED_PROXIES may claim any client address: the shipped
    10.0.0.0/8 (the pod network) let any pod rotate X-Forwarded-For past the login guard
    (issue 34, item 2). Shipped empty, and the comment says to list the ingress only."""
    config = _one("ConfigMap", "gantry-config")["data"]
    assert config["GANTRY_TRUSTED_PROXIES"] == ""
    text = (K8S / "03-config.yaml").read_text()
    assert "ingress controller's addresses only" in text


def test_config_names_the_base_url() -> None:
    """The links in emails need the portal's public address (issue 34, item 8)."""
    assert _one("ConfigMap", "gantry-config")["data"]["GANTRY_BASE_URL"].startswith("https://")


def test_examples_and_templates_are_not_applied() -> None:
    applied = {(d["kind"], d["metadata"]["name"]) for d in _docs(applied_only=True)}
    assert ("Secret", "gantry-secrets") not in applied, "applying must not overwrite the secret"
    tenant_namespaces = [d for d in _docs("Namespace") if d["metadata"]["name"] != NAMESPACE]
    assert tenant_namespaces, "a Namespace template for tenant projects"
    for ns in tenant_namespaces:
        assert ("Namespace", ns["metadata"]["name"]) not in applied
        assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_gpu_taint_is_documented() -> None:
    docs = (K8S / "README.md").read_text() + DEPLOYMENT_DOC.read_text()
    assert "kubectl taint nodes" in docs
    assert "nvidia.com/gpu=present:NoSchedule" in docs


# --------------------------------------------------------------------------------------------
# (c) docker-compose.yml


@cache
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def _service(name: str) -> dict[str, Any]:
    return compose()["services"][name]  # type: ignore[no-any-return]


def test_compose_services() -> None:
    # Services of an optional profile (monitoring: tests/metrics/test_monitoring_files.py)
    # start only when asked for.
    default = {n for n, s in compose()["services"].items() if not s.get("profiles")}
    assert default == COMPOSE_SERVICES
    assert str(_service("postgres")["image"]).startswith("postgres:15")
    assert str(_service("redis")["image"]).startswith("redis:7")


def test_compose_app_services_share_one_image() -> None:
    images, environments = set(), []
    for name in sorted(COMPOSE_APP_SERVICES):
        service = _service(name)
        build = service["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE, name
        images.add(service["image"])
        environments.append(service["environment"])
    assert len(images) == 1, images
    assert all(env == environments[0] for env in environments), "one shared environment"


def test_compose_environment() -> None:
    env = _service("web")["environment"]
    assert isinstance(env, dict)
    unknown = set(env) - env_read_by_project() - PROCESS_ENV
    assert not unknown, f"nothing reads {unknown}"
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY"} <= set(env)
    assert env["DATABASE_URL"].startswith("postgres://")
    assert env["REDIS_URL"].startswith("redis://")
    assert "@postgres:" in env["DATABASE_URL"] and "//redis:" in env["REDIS_URL"]


@pytest.mark.parametrize("name", sorted(COMPOSE_APP_SERVICES))
def test_compose_command_exists(name: str) -> None:
    problems = command_problems(_service(name)["command"])
    assert not problems, f"{name}: {problems}"


def test_compose_commands_per_service() -> None:
    commands = {name: " ".join(_argv(_service(name)["command"])) for name in COMPOSE_APP_SERVICES}
    assert "manage.py migrate" in commands["migrate"]
    assert commands["web"].startswith("gunicorn config.wsgi:application")
    assert "0.0.0.0:8000" in commands["web"]
    assert commands["scheduler"] in (
        "python manage.py run_scheduler",
        "python manage.py run_scheduler --metrics-port 9402",  # the monitoring profile's
    )
    assert commands["worker"].startswith("celery -A config worker")
    assert commands["beat"].startswith("celery -A config beat")


def test_compose_startup_order() -> None:
    healthy = {"condition": "service_healthy"}
    assert _service("migrate")["depends_on"]["postgres"] == healthy
    assert _service("migrate").get("restart") == "no"
    for name in sorted(COMPOSE_APP_SERVICES - {"migrate"}):
        depends = _service(name)["depends_on"]
        assert depends["postgres"] == healthy, name
        assert depends["redis"] == healthy, name
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
    for name, service in compose()["services"].items():
        for dependency, condition in service.get("depends_on", {}).items():
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in _service(dependency), f"{name} waits on {dependency}"
    assert "/healthz" in json.dumps(_service("web")["healthcheck"])


# --------------------------------------------------------------------------------------------
# (d) platform/Dockerfile


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = pending + line
        pending = ""
        keyword, _, rest = full.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
    return instructions


def _instruction_args(rest: str) -> list[str]:
    if rest.startswith("["):
        return [str(a) for a in json.loads(rest)]
    return shlex.split(rest)


def _copy_sources() -> list[str]:
    sources = []
    for keyword, rest in dockerfile_instructions():
        if keyword not in ("COPY", "ADD"):
            continue
        args = _instruction_args(rest)
        flags = [a for a in args if a.startswith("--")]
        if any(f.startswith("--from") for f in flags):
            continue
        paths = [a for a in args if not a.startswith("--")]
        sources.extend(paths[:-1])
    return sources


def test_dockerfile_sources_exist() -> None:
    sources = _copy_sources()
    assert sources
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert not missing, f"platform/Dockerfile copies paths that do not exist: {missing}"
    ignored = {
        line.strip().rstrip("/")
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    excluded = [s for s in sources if Path(s).parts[0] in ignored]
    assert not excluded, f".dockerignore drops what the Dockerfile copies: {excluded}"


def test_dockerfile_copies_every_package() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*").rstrip(".") for pattern in include}
    copied = {Path(s).parts[0] for s in _copy_sources()}
    assert packages <= copied, f"not in the image: {packages - copied}"
    assert {"manage.py", "pyproject.toml"} <= copied


def test_dockerfile_image() -> None:
    instructions = dockerfile_instructions()
    args = {}
    for keyword, rest in instructions:
        if keyword == "ARG" and "=" in rest:
            key, value = rest.split("=", 1)
            args[key] = value
    bases = [
        re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], rest.split()[0])
        for keyword, rest in instructions
        if keyword == "FROM"
    ]
    assert bases[0] == "python:3.11-slim", bases
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "runs as a non-root user"
    assert any(k == "EXPOSE" and "8000" in r.split() for k, r in instructions)
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "pip install" in runs
    assert "manage.py collectstatic --noinput" in runs
    assert re.search(r"DJANGO_SECRET_KEY=\S+.*collectstatic", runs), "a build-time dummy secret"
    (cmd,) = [rest for keyword, rest in instructions if keyword == "CMD"][-1:]
    assert _instruction_args(cmd)[:2] == ["gunicorn", "config.wsgi:application"]
    assert not command_problems(_instruction_args(cmd))


# --------------------------------------------------------------------------------------------
# docs/deployment.md


def test_deployment_doc_covers_the_environment() -> None:
    text = DEPLOYMENT_DOC.read_text()
    missing = sorted(name for name in SETTINGS_ENV if f"`{name}`" not in text)
    assert not missing, f"docs/deployment.md does not document {missing}"
    for needle in (
        "docker compose",
        "kubectl apply -f platform/k8s/",
        "check --deploy",
        "run_node_agent",
    ):
        assert needle in text, needle
