"""Clusters: each backend the daemon drives, as a row platform admins manage
(docs/multicluster.md).

The home cluster is the backend `run_scheduler` drove before clusters were rows (made by the
migration that added this table, named by GANTRY_CLUSTER_NAME): its nodes keep their plain
names. Every other cluster's nodes are named `<cluster>:<node>`.

Credentials are never stored: a cluster names a kubeconfig file (a path the daemon reads) or a
mounted Secret's file (a name under GANTRY_CLUSTER_SECRETS_DIR), and a context in it.
"""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class ClusterBackendKind(models.TextChoices):
    SIMULATED = "simulated"
    KUBERNETES = "kubernetes"


class ClusterState(models.TextChoices):
    ACTIVE = "active"
    CORDONED = "cordoned"  # nothing new is placed there; what runs keeps running
    LOST = "lost"  # set by the daemon: it has not answered for `lost_after_s`


class Cluster(models.Model):
    name = models.CharField(max_length=63, unique=True)
    backend = models.CharField(max_length=16, choices=ClusterBackendKind.choices)
    home = models.BooleanField(default=False, help_text="Its nodes keep their plain names.")
    kubeconfig_path = models.CharField(max_length=500, blank=True, default="")
    kubeconfig_secret = models.CharField(
        max_length=253, blank=True, default="", help_text="A file under GANTRY_CLUSTER_SECRETS_DIR."
    )
    kube_context = models.CharField(max_length=253, blank=True, default="")
    labels = models.JSONField(default=dict, blank=True)  # region, site
    state = models.CharField(
        max_length=16, choices=ClusterState.choices, default=ClusterState.ACTIVE
    )
    # The admin's cordon, kept while the cluster is lost: it is cordoned again, not active,
    # when it answers.
    cordoned = models.BooleanField(db_default=False, default=False)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    # None: GANTRY_CLUSTER_LOST_AFTER_S.
    lost_after_s = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(
                fields=["home"], condition=Q(home=True), name="cluster_one_home"
            ),
            models.CheckConstraint(
                condition=Q(name__regex=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\Z"),
                name="cluster_name_dns_label",
            ),
            models.CheckConstraint(
                condition=Q(kubeconfig_path="") | Q(kubeconfig_secret=""),
                name="cluster_one_credential",
            ),
        ]

    def __str__(self) -> str:
        return self.name
