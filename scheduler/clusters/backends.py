"""The backends the daemon drives, from the Cluster rows (`run_scheduler`).

One active cluster (the installation as before clusters were rows): exactly the backend
`run_scheduler --backend` names, unchanged. Several: a `FederatedBackend` over each active
or lost one's backend (a cordoned cluster is still driven: what runs there is watched and
ended as usual; nothing new is placed there), the home cluster's being the one
`run_scheduler` made. Credentials are read where the row points, when the daemon starts.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any, cast

from django.conf import settings

from scheduler.backends import factory
from scheduler.backends.base import (
    ClusterBackend,
    GpuInfo,
    LogSource,
    NodeInfo,
    PodPhase,
    PodStatus,
)
from scheduler.backends.federated import Member, federate
from scheduler.backends.federated.backend import FederatedBackend, Seen
from scheduler.backends.federated.logs import FederatedLogs
from scheduler.backends.federated.naming import split
from scheduler.clusters.services import clusters_seen
from scheduler.models import (
    Allocation,
    Cluster,
    ClusterBackendKind,
    ClusterState,
    JobState,
    Node,
)

log = logging.getLogger("gantry.daemon")

RUNNING_STATES = (JobState.RUNNING,)


def driven_clusters() -> list[Cluster]:
    return list(Cluster.objects.order_by("name"))


def kubeconfig_of(cluster: Cluster) -> str | None:
    """The kubeconfig file the row names (a path, or a mounted Secret's file); None: the
    daemon's own credentials (the home cluster only)."""
    if cluster.kubeconfig_path:
        return cluster.kubeconfig_path
    if cluster.kubeconfig_secret:
        return str(Path(settings.GANTRY_CLUSTER_SECRETS_DIR) / cluster.kubeconfig_secret)
    return None


def kubernetes_backend(cluster: Cluster) -> ClusterBackend:
    from kubernetes import client
    from kubernetes import config as kube_config

    from scheduler.backends.kubernetes.backend import KubernetesBackend

    configuration = client.Configuration()
    kube_config.load_kube_config(
        config_file=kubeconfig_of(cluster),
        context=cluster.kube_context or None,
        client_configuration=configuration,
    )
    configuration.retries = False  # retries are the backend's own
    return KubernetesBackend(client.ApiClient(configuration))


def member_backend(cluster: Cluster, home_backend: ClusterBackend) -> ClusterBackend:
    if cluster.home:
        return home_backend
    if cluster.backend == ClusterBackendKind.KUBERNETES:
        return kubernetes_backend(cluster)
    from scheduler.backends.simulated.cluster import SimulatedCluster
    from scheduler.backends.simulated.inventory import demo_nodes

    # A simulated cluster has the home's hardware when the home is simulated too (the nodes
    # `run_scheduler --nodes-csv` read: the flavors the tenants hold quota for), else the demo's.
    nodes = list(home_backend.nodes) if isinstance(home_backend, SimulatedCluster) else demo_nodes()
    if not settings.GANTRY_SIM_STATE_FILE:
        return SimulatedCluster(nodes)
    from scheduler.backends.simulated.statefile import PersistentCluster

    # Each simulated cluster's pods in a file of its own, beside the home one's.
    return PersistentCluster(nodes, Path(f"{settings.GANTRY_SIM_STATE_FILE}.{cluster.name}"))


def log_source() -> LogSource:
    """The log source of the web and API processes: the home backend's alone (as before
    clusters were rows) with one cluster; else one that reads each pod's log in its cluster.
    Each cluster's source is built once per process and configuration."""
    clusters = driven_clusters()
    if len(clusters) <= 1:
        return factory.log_source()
    shape = tuple(
        (c.name, c.backend, c.home, c.kubeconfig_path, c.kubeconfig_secret, c.kube_context)
        for c in clusters
    )
    return _federated_logs(shape)


@functools.cache
def _federated_logs(shape: tuple[tuple[Any, ...], ...]) -> LogSource:
    clusters = {row[0]: Cluster.objects.get(name=row[0]) for row in shape}
    sources: dict[str, LogSource] = {}
    for name, cluster in clusters.items():
        if cluster.home:
            sources[name] = factory.log_source()
        elif cluster.backend == ClusterBackendKind.KUBERNETES:
            sources[name] = cast(LogSource, kubernetes_backend(cluster))
        else:
            from scheduler.backends.simulated.logs import SimulatedLogs

            sources[name] = SimulatedLogs()
    home = next((name for name, c in clusters.items() if c.home), "")
    return FederatedLogs(sources, home)


def last_known(clusters: list[Cluster], home: str) -> dict[str, Seen]:
    """What the database holds of each cluster's nodes and pods: a member that does not answer
    when the daemon starts (a standby taking over during an outage) is held as the ledger
    says (its jobs charged and held until its deadline), never as empty: no pods would read
    as every pod gone, and no nodes as every node gone, whose jobs fail at once."""
    pods: dict[str, list[PodStatus]] = defaultdict(list)
    rows = Allocation.objects.filter(ended_at__isnull=True).values_list(
        "pod_name",
        "job__project__namespace",
        "job_id",
        "attempt",
        "replica",
        "node__name",
        "job__state",
    )
    for pod, namespace, job_id, attempt, replica, node, state in rows:
        cluster, _ = split(node, home)
        phase = PodPhase.RUNNING if state in RUNNING_STATES else PodPhase.PENDING
        pods[cluster].append(PodStatus(pod, namespace, job_id, attempt, replica, node, phase))
    nodes = _nodes_known(clusters, home)
    return {
        c.name: Seen(nodes=tuple(nodes[c.name]), pods=tuple(pods[c.name]))
        for c in clusters
        if not c.home
    }


def _nodes_known(clusters: list[Cluster], home: str) -> dict[str, list[NodeInfo]]:
    """Each cluster's present nodes as the daemon last synced them (`node_sync`), qualified."""
    out: dict[str, list[NodeInfo]] = defaultdict(list)
    others = [c.pk for c in clusters if not c.home]
    rows = Node.objects.filter(present=True, cluster_id__in=others).prefetch_related("devices")
    names = {c.pk: c.name for c in clusters}
    for node in rows.order_by("name"):
        if node.cluster_id is None:  # home's, which the filter leaves out
            continue
        gpus = tuple(
            GpuInfo(d.index, d.memory_mib, healthy=d.healthy, uuid=d.uuid)
            for d in sorted(node.devices.all(), key=lambda d: d.index)
        )
        out[names[node.cluster_id]].append(
            NodeInfo(
                name=node.name,
                flavor=node.flavor,
                gpus=gpus,
                cpu_milli=node.cpu_milli,
                memory_mib=node.memory_mib,
                rdma=node.rdma,
                ready=node.ready,
                unschedulable=node.cluster_unschedulable,
                labels=dict(node.labels),
                taints=tuple(tuple(t) for t in node.taints),
            )
        )
    return out


def backend_for_clusters(home_backend: ClusterBackend) -> ClusterBackend:
    """`home_backend` alone while one cluster is the only one; else the federation."""
    clusters = driven_clusters()
    if len(clusters) <= 1:
        return home_backend
    members = [
        Member(c.name, member_backend(c, home_backend), home=c.home, labels=dict(c.labels))
        for c in clusters
    ]
    home = next((c.name for c in clusters if c.home), "")
    return federate(members, seed=last_known(clusters, home))


class ClusterWatch:
    """A hook of the daemon's cycle (`run_scheduler`): records which clusters answered their
    last list, and marks lost those silent past their deadline (`clusters_seen`), under the
    lease."""

    def __init__(self, backend: FederatedBackend) -> None:
        self.backend = backend

    def on_lead(self) -> None:
        """Daemon hook "leading": what a silent cluster runs is what the database holds, not
        what this process listed before it last led (`FederatedBackend.reseed`)."""
        self.backend.reseed(last_known(driven_clusters(), self.backend.home))
        self.backend.lost = set(
            Cluster.objects.filter(state=ClusterState.LOST).values_list("name", flat=True)
        )

    def tick(self, daemon: Any) -> None:
        if not daemon.lease.leading or not self.backend.answered:
            return
        with daemon.lease.writing():
            lost = clusters_seen(
                answered=dict(self.backend.answered),
                now=daemon.now_dt(),
                default_lost_after_s=settings.GANTRY_CLUSTER_LOST_AFTER_S,
            )
        for name in sorted(lost):
            log.warning("cluster %s is lost: it has not answered past its deadline", name)
        self.backend.lost = set(
            Cluster.objects.filter(state=ClusterState.LOST).values_list("name", flat=True)
        )
