"""Clusters as rows: the home cluster the migration makes, platform admins' changes (audited,
validated, nothing changed on a refusal), and node sync assigning nodes to their cluster."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from common.errors import ConflictError
from scheduler.backends.base import GpuInfo, NodeInfo
from scheduler.clusters.services import (
    cluster_create,
    cluster_delete,
    cluster_set_cordoned,
    cluster_update,
    clusters_seen,
)
from scheduler.models import Cluster, ClusterState, Node
from scheduler.nodes.services import node_sync
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db


def test_the_migration_makes_the_home_cluster_of_every_node(settings: Any) -> None:
    from django.apps import apps

    migration = importlib.import_module("scheduler.migrations.0024_home_cluster")
    Cluster.objects.all().delete()
    Node.objects.create(name="n1")
    Node.objects.create(name="n2")
    settings.GANTRY_CLUSTER_NAME, settings.GANTRY_CLUSTER_BACKEND = "site-a", "kubernetes"
    migration.home_cluster(apps, None)
    migration.home_cluster(apps, None)  # again: nothing more
    home = Cluster.objects.get()
    assert (home.name, home.backend, home.home, home.state) == (
        "site-a",
        "kubernetes",
        True,
        "active",
    )
    assert set(Node.objects.values_list("cluster_id", flat=True)) == {home.pk}


def test_a_platform_admin_adds_a_cluster_audited(org: Any) -> None:
    pat = org.users["pat"]
    made = cluster_create(
        user=pat,
        name="site-b",
        backend="kubernetes",
        kubeconfig_secret="site-b.kubeconfig",
        kube_context="b",
        labels={"region": "eu-west", "site": "b"},
    )
    entry = AuditEntry.objects.get(action="cluster.create")
    assert entry.actor == pat and entry.target_id == str(made.pk)
    assert entry.after["labels"] == {"region": "eu-west", "site": "b"}
    assert entry.after["kubeconfig_secret"] == "site-b.kubeconfig"


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"name": "Site_B", "backend": "kubernetes", "kubeconfig_path": "/k"}, "name"),
        ({"name": "b", "backend": "slurm"}, "backend"),
        ({"name": "b", "backend": "kubernetes"}, "kubeconfig_path"),
        ({"name": "b", "backend": "kubernetes", "kubeconfig_path": "rel/k"}, "kubeconfig_path"),
        (
            {"name": "b", "backend": "kubernetes", "kubeconfig_secret": "../etc"},
            "kubeconfig_secret",
        ),
        (
            {
                "name": "b",
                "backend": "kubernetes",
                "kubeconfig_path": "/k",
                "kubeconfig_secret": "k",
            },
            "kubeconfig_secret",
        ),
        ({"name": "b", "backend": "simulated", "kube_context": "x"}, "backend"),
        ({"name": "b", "backend": "simulated", "labels": {"zone a": "x"}}, "labels"),
        ({"name": "b", "backend": "simulated", "labels": {"region": "EU West"}}, "labels"),
        ({"name": "b", "backend": "simulated", "lost_after_s": 0}, "lost_after_s"),
        ({"name": "b", "backend": "simulated", "token": "secret"}, "token"),
    ],
    ids=[
        "name-not-dns",
        "unknown-backend",
        "k8s-without-kubeconfig",
        "relative-path",
        "secret-with-path",
        "both-credentials",
        "simulated-with-context",
        "bad-label-key",
        "label-value-not-dns",
        "lost-after-zero",
        "credential-itself",
    ],
)
def test_bad_input_is_refused_naming_the_field_and_changes_nothing(
    org: Any, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        cluster_create(user=org.users["pat"], **fields)
    assert field in refused.value.message_dict
    assert not Cluster.objects.filter(home=False).exists()
    assert not AuditEntry.objects.filter(action="cluster.create").exists()


def test_others_may_not_add_or_change_clusters(org: Any) -> None:
    for name in ("carol", "dana", "alice"):
        with pytest.raises(PermissionDenied):
            cluster_create(user=org.users[name], name="b", backend="simulated")
    home = Cluster.objects.get(home=True)
    with pytest.raises(PermissionDenied):
        cluster_set_cordoned(user=org.users["carol"], cluster=home, cordoned=True)
    assert not Cluster.objects.filter(name="b").exists()


def test_a_taken_name_is_a_conflict(org: Any) -> None:
    with pytest.raises(ConflictError):
        cluster_create(user=org.users["pat"], name="local", backend="simulated")


def test_the_database_holds_one_home_and_dns_names(org: Any) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Cluster.objects.create(name="other", backend="simulated", home=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        Cluster.objects.create(name="Not A Label", backend="simulated")


def test_update_changes_what_may_change_audited_and_not_the_name(org: Any) -> None:
    pat = org.users["pat"]
    b = cluster_create(user=pat, name="b", backend="kubernetes", kubeconfig_path="/etc/b")
    cluster_update(user=pat, cluster=b, labels={"region": "us"}, lost_after_s=120)
    b.refresh_from_db()
    assert (b.labels, b.lost_after_s) == ({"region": "us"}, 120)
    entry = AuditEntry.objects.get(action="cluster.update")
    assert entry.before == {"labels": {}, "lost_after_s": None}
    assert entry.after == {"labels": {"region": "us"}, "lost_after_s": 120}
    with pytest.raises(ValidationError) as refused:
        cluster_update(user=pat, cluster=b, name="c")
    assert "name" in refused.value.message_dict
    with pytest.raises(ValidationError):  # the kubeconfig cannot be taken away
        cluster_update(user=pat, cluster=b, kubeconfig_path="")
    b.refresh_from_db()
    assert (b.name, b.kubeconfig_path) == ("b", "/etc/b")


def test_cordon_and_uncordon_are_audited_and_a_lost_cluster_stays_lost(org: Any) -> None:
    pat = org.users["pat"]
    b = cluster_create(user=pat, name="b", backend="simulated")
    cluster_set_cordoned(user=pat, cluster=b, cordoned=True)
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.CORDONED
    cluster_set_cordoned(user=pat, cluster=b, cordoned=False)
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.ACTIVE
    assert list(
        AuditEntry.objects.filter(target_id=str(b.pk))
        .order_by("id")
        .values_list("action", flat=True)
    ) == ["cluster.create", "cluster.cordon", "cluster.uncordon"]
    Cluster.objects.filter(pk=b.pk).update(state=ClusterState.LOST)
    with pytest.raises(ConflictError):
        cluster_set_cordoned(user=pat, cluster=b, cordoned=False)


def test_delete_only_a_cluster_without_nodes(org: Any) -> None:
    pat = org.users["pat"]
    with pytest.raises(ConflictError):
        cluster_delete(user=pat, cluster=Cluster.objects.get(home=True))
    b = cluster_create(user=pat, name="b", backend="simulated")
    Node.objects.create(name="b:n1", cluster=b)
    with pytest.raises(ConflictError):
        cluster_delete(user=pat, cluster=b)
    c = cluster_create(user=pat, name="c", backend="simulated")
    cluster_delete(user=pat, cluster=c)
    assert not Cluster.objects.filter(name="c").exists()
    assert AuditEntry.objects.filter(action="cluster.delete", target_id=str(c.pk)).exists()


def _info(name: str, **labels: str) -> NodeInfo:
    return NodeInfo(name, "H100-80GB", (GpuInfo(0, 81920),), 64_000, 1 << 19, labels=labels)


def test_node_sync_puts_each_node_in_its_labelled_cluster_else_home(org: Any) -> None:
    b = cluster_create(user=org.users["pat"], name="b", backend="simulated")
    node_sync([_info("n1"), _info("b:n1", **{"gantry.io/cluster": "b"})])
    home = Cluster.objects.get(home=True)
    assert dict(Node.objects.values_list("name", "cluster_id")) == {"n1": home.pk, "b:n1": b.pk}


def test_the_daemon_marks_a_silent_cluster_lost_after_its_deadline_and_back(org: Any) -> None:
    b = cluster_create(user=org.users["pat"], name="b", backend="simulated")
    t0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
    clusters_seen(answered={"b": True}, now=t0, default_lost_after_s=60)
    # 60 s without an answer is within the deadline; 61 s is past it.
    assert (
        clusters_seen(
            answered={"b": False}, now=t0 + timedelta(seconds=60), default_lost_after_s=60
        )
        == set()
    )
    assert clusters_seen(
        answered={"b": False}, now=t0 + timedelta(seconds=61), default_lost_after_s=60
    ) == {"b"}
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.LOST
    clusters_seen(answered={"b": True}, now=t0 + timedelta(seconds=90), default_lost_after_s=60)
    b.refresh_from_db()
    assert (b.state, b.last_seen_at) == (ClusterState.ACTIVE, t0 + timedelta(seconds=90))


@pytest.mark.parametrize("state", [ClusterState.CORDONED, ClusterState.LOST])
def test_the_engine_sees_a_closed_clusters_nodes_cordoned(org: Any, state: str) -> None:
    from scheduler.snapshot.translate import load_nodes

    b = cluster_create(user=org.users["pat"], name="b", backend="simulated")
    node_sync([_info("n1"), _info("b:n1", **{"gantry.io/cluster": "b"})])
    nodes, _, _ = load_nodes()
    assert not nodes["b:n1"].cordoned
    Cluster.objects.filter(pk=b.pk).update(state=state)
    nodes, _, _ = load_nodes()
    assert nodes["b:n1"].cordoned and not nodes["n1"].cordoned


def test_a_cordoned_cluster_that_was_lost_is_cordoned_again_when_it_answers(org: Any) -> None:
    pat = org.users["pat"]
    b = cluster_create(user=pat, name="b", backend="simulated")
    cluster_set_cordoned(user=pat, cluster=b, cordoned=True)
    t0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
    clusters_seen(answered={"b": True}, now=t0, default_lost_after_s=60)
    clusters_seen(answered={"b": False}, now=t0 + timedelta(seconds=61), default_lost_after_s=60)
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.LOST
    clusters_seen(answered={"b": True}, now=t0 + timedelta(seconds=70), default_lost_after_s=60)
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.CORDONED


def test_a_lost_cluster_cordoned_by_an_admin_comes_back_cordoned(org: Any) -> None:
    pat = org.users["pat"]
    b = cluster_create(user=pat, name="b", backend="simulated")
    Cluster.objects.filter(pk=b.pk).update(state=ClusterState.LOST)
    cluster_set_cordoned(user=pat, cluster=b, cordoned=True)
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.LOST  # the daemon's word stays
    clusters_seen(
        answered={"b": True}, now=datetime(2026, 12, 6, tzinfo=UTC), default_lost_after_s=60
    )
    assert Cluster.objects.get(pk=b.pk).state == ClusterState.CORDONED
