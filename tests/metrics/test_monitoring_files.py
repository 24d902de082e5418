"""platform/monitoring/, offline: the Grafana dashboard draws only series Gantry exports, the
Prometheus configurations scrape what Gantry serves, and the compose `monitoring` profile
mounts files that exist (issue 20). No promtool: PromQL is read roughly, for metric names."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from scheduler.agent.exporter import DcgmExporter
from scheduler.agent.nvml import NvmlSession
from scheduler.metrics.cycles import CycleMetrics
from tests.k8s.test_agent import FakeNvml
from tests.metrics.helpers import TOKEN

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "platform" / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "gantry.json"
COMPOSE = ROOT / "docker-compose.yml"
K8S = ROOT / "platform" / "k8s"

SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ()}
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
    "unless", "offset", "inf", "nan",
}  # fmt: skip


def _names(text: str) -> set[str]:
    """The names a PromQL expression may use for what this exposition holds."""
    out = set()
    for family in text_string_to_metric_families(text):
        out.add(family.name)
        out.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ()))
    return out


@pytest.fixture
def exported(db: None, settings: Any) -> set[str]:
    """Every series name Gantry serves: the web's /metrics (families are listed even when
    empty), the daemon's and the node agent's."""
    settings.GANTRY_METRICS_TOKEN = TOKEN
    response = Client(headers={"Authorization": f"Bearer {TOKEN}"}).get("/metrics")
    names = _names(response.content.decode())
    names |= _names(generate_latest(CycleMetrics().registry).decode())
    agent = DcgmExporter("n")
    agent.update(NvmlSession(FakeNvml(ecc=(0, 0))).read())  # type: ignore[arg-type]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(agent)
    names |= _names(generate_latest(registry).decode())
    # Neither fake reads power or GPM: their families are named by the exporter all the same.
    names |= {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_PROF_SM_ACTIVE"}
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression, roughly: strings, label matchers, ranges and
    grouping clauses removed; then every identifier not called as a function nor a keyword."""
    expr = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    found = set()
    for match in re.finditer(r"(?<![\w$.])([A-Za-z_:][\w:]*)(\s*\()?", expr):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in PROMQL_WORDS:
            continue
        found.add(name)
    return found


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (flavor) (gantry_gpus_free{flavor=~"$f"})', {"gantry_gpus_free"}),
        (
            "histogram_quantile(0.9, sum by (le) (rate(x_bucket[$__rate_interval])))",
            {"x_bucket"},
        ),
        ("a / (b + c) > 0", {"a", "b", "c"}),
        ("time() - max(t)", {"t"}),
        ('count by (namespace) (u{pod!=""} < 5)', {"u"}),
    ],
)
def test_the_promql_reader(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


@cache
def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text())
    assert isinstance(data, dict)
    return data


def _exprs() -> list[tuple[str, str]]:
    out = []
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for variable in dashboard()["templating"]["list"]:
        query = variable["query"]["query"]
        inner = re.fullmatch(r"label_values\((\w+),\s*\w+\)", query)
        assert inner, f"variable {variable['name']}: {query}"
        out.append((f"${variable['name']}", inner.group(1)))
    return out


def test_the_dashboard_draws_only_series_gantry_exports(exported: set[str]) -> None:
    missing = {
        (title, name)
        for title, expr in _exprs()
        for name in metric_names(expr)
        if name not in exported
    }
    assert not missing, missing
    # The reader finds what it must: a name Gantry does not serve is caught.
    assert metric_names("rate(kueue_pending_workloads[5m])") - exported


def test_the_dashboard_covers_cluster_tenants_and_nodes() -> None:
    rows = [p["title"] for p in dashboard()["panels"] if p["type"] == "row"]
    assert rows == ["Cluster", "Tenants", "Nodes"]
    used = {name for _, expr in _exprs() for name in metric_names(expr)}
    for needed in ("gantry_pending_workloads", "gantry_admission_wait_time_seconds_bucket",
                   "gantry_cluster_queue_resource_usage", "gantry_cluster_queue_nominal_quota",
                   "gantry_cluster_queue_borrowed_resources", "gantry_preempted_workloads_total",
                   "gantry_gpus_fragmented", "gantry_admission_attempt_duration_seconds_bucket",
                   "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE"):  # fmt: skip
        assert needed in used, needed
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for panel in dashboard()["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "prometheus", panel["title"]


def _yaml(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), path
    return data


def _jobs(path: Path) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in _yaml(path)["scrape_configs"]}


def _container(path: str, name: str) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all((K8S / path).read_text()) if d]
    (workload,) = [
        d
        for d in docs
        if d["metadata"]["name"] == name and d["kind"] in ("Deployment", "DaemonSet")
    ]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_the_kubernetes_scrape_configuration() -> None:
    jobs = _jobs(MONITORING / "prometheus.yml")
    assert set(jobs) == {"gantry", "gantry-scheduler", "gantry-node-agent"}
    web = jobs["gantry"]
    assert web["metrics_path"] == "/metrics"
    assert web["authorization"]["type"] == "Bearer" and web["authorization"]["credentials_file"]
    assert web["static_configs"][0]["targets"] == ["gantry-web.gantry-system.svc:80"]
    for job, workload, manifest in (
        ("gantry-scheduler", "gantry-scheduler", "21-scheduler.yaml"),
        ("gantry-node-agent", "gantry-node-agent", "30-node-agent.yaml"),
    ):
        config = jobs[job]
        assert config["kubernetes_sd_configs"][0]["role"] == "pod", job
        keeps = {
            tuple(r["source_labels"]): r["regex"]
            for r in config["relabel_configs"]
            if r.get("action") == "keep"
        }
        assert keeps[("__meta_kubernetes_pod_label_app_kubernetes_io_name",)] == workload
        port = keeps[("__meta_kubernetes_pod_container_port_name",)]
        container = _container(manifest, workload)
        assert port in [p["name"] for p in container["ports"]], job
    # The agent's series carry the pod and namespace of the job holding the GPU: kept.
    assert jobs["gantry-node-agent"]["honor_labels"] is True
    agent = _container("30-node-agent.yaml", "gantry-node-agent")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    (port,) = [p["containerPort"] for p in agent["ports"] if p["name"] == "metrics"]
    assert env["GANTRY_AGENT_METRICS_PORT"] == str(port)
    scheduler = _container("21-scheduler.yaml", "gantry-scheduler")
    (port,) = [p["containerPort"] for p in scheduler["ports"] if p["name"] == "metrics"]
    assert scheduler["args"] == ["--metrics-port", str(port)]


def _compose() -> dict[str, Any]:
    return _yaml(COMPOSE)


def test_the_compose_monitoring_profile() -> None:
    services = _compose()["services"]
    profile = {n for n, s in services.items() if "monitoring" in s.get("profiles", [])}
    assert profile == {"prometheus", "grafana"}
    for name in sorted(profile):
        for volume in services[name].get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name}: {source}"
    prometheus = services["prometheus"]
    (config,) = [
        v.split(":")[0] for v in prometheus["volumes"] if ":/etc/prometheus/prometheus.yml" in v
    ]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    jobs = _jobs(COMPOSE.parent / config)
    assert jobs["gantry"]["static_configs"][0]["targets"] == ["web:8000"]
    secret = jobs["gantry"]["authorization"]["credentials_file"]
    assert secret == "/run/secrets/" + prometheus["secrets"][0]
    assert _compose()["secrets"][prometheus["secrets"][0]] == {
        "environment": "GANTRY_METRICS_TOKEN"
    }
    assert "GANTRY_METRICS_TOKEN" in services["web"]["environment"]
    assert "web" in services["web"]["environment"]["DJANGO_ALLOWED_HOSTS"]
    (scheduler_target,) = jobs["gantry-scheduler"]["static_configs"][0]["targets"]
    port = scheduler_target.split(":")[1]
    assert services["scheduler"]["command"][-2:] == ["--metrics-port", port]


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    grafana = _compose()["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    provisioning = COMPOSE.parent / next(
        src for src, dst in mounts.items() if dst == "/etc/grafana/provisioning"
    )
    (datasource,) = _yaml(provisioning / "datasources" / "prometheus.yml")["datasources"]
    assert datasource["uid"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = _yaml(provisioning / "dashboards" / "gantry.yml")["providers"]
    folder = provider["options"]["path"]
    source = next(src for src, dst in mounts.items() if dst == folder)
    assert (COMPOSE.parent / source / DASHBOARD.name).resolve() == DASHBOARD.resolve()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{folder}/{DASHBOARD.name}"


def test_grafana_has_no_default_password() -> None:
    """Grafana shipped admin/admin (issue 34, item 8): the password comes from .env only, and
    the container refuses to start without it, or with `admin`."""
    import subprocess

    grafana = _compose()["services"]["grafana"]
    assert grafana["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == "${GRAFANA_ADMIN_PASSWORD:-}"
    shell, flag, script = grafana["entrypoint"]
    assert (shell, flag) == ("/bin/sh", "-c") and script.endswith("exec /run.sh")
    # The check as the container runs it (compose turns $$ into $), with /run.sh a stand-in.
    check = script.replace("$$", "$").replace("exec /run.sh", "echo started")
    for password, started in [("", False), ("admin", False), ("s3cret-Pw", True)]:
        run = subprocess.run(
            ["/bin/sh", "-c", check],
            env={"GF_SECURITY_ADMIN_PASSWORD": password},
            capture_output=True,
            text=True,
            check=False,
        )
        assert (run.returncode == 0 and run.stdout == "started\n") == started, (password, run)
        if not started:
            assert "set GRAFANA_ADMIN_PASSWORD" in run.stderr
