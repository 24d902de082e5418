"""Platform admins' changes to clusters, each audited in its transaction; and the daemon's
record of whether each cluster answers.

A cluster's name is fixed once made: its nodes are named after it (`<cluster>:<node>`), and
their allocations and history keep those names. An admin may cordon a cluster (nothing new is
placed there, what runs keeps running) and make it active again; "lost" is the daemon's word
alone, and it lifts it when the cluster answers again.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from common.errors import ConflictError
from common.text import DNS_LABEL, label_errors
from scheduler.models import Cluster, ClusterBackendKind, ClusterState
from tenants import access
from tenants.audit import audit_record, audit_snapshot

# A key of a Secret's data, mounted as a file of that name (no path: it is read only under
# GANTRY_CLUSTER_SECRETS_DIR).
SECRET_KEY = re.compile(r"^[-_a-zA-Z0-9][-._a-zA-Z0-9]{0,252}\Z")
# Labels with a meaning of their own: where the cluster is (its nodes carry them).
LABEL_KEYS = frozenset({"region", "site"})
EDITABLE = ("kubeconfig_path", "kubeconfig_secret", "kube_context", "labels", "lost_after_s")


def _labels_errors(labels: Any) -> list[str]:
    """Labels are Kubernetes-style (`common.text.label_errors`): `region` and `site` name
    where the cluster is (DNS labels: its nodes carry them), any other what it holds or
    offers, e.g. `data.example.com/imagenet: "true"` for data locality (docs/multicluster.md)."""
    errors = label_errors(labels)
    if errors or not isinstance(labels, dict):
        return errors
    for key in sorted(LABEL_KEYS & labels.keys()):
        if not DNS_LABEL.match(labels[key]):
            errors.append(
                f"{key}: {labels[key][:70]!r} is not 1-63 lowercase letters, digits or '-'."
            )
    return errors


def _credential_errors(fields: dict[str, Any], backend: str, home: bool) -> dict[str, list[str]]:
    """A Kubernetes cluster other than home names its kubeconfig (a path, or a mounted
    Secret's file); the home one may use in-cluster credentials. Never the credential itself."""
    path, secret = fields.get("kubeconfig_path", ""), fields.get("kubeconfig_secret", "")
    errors: dict[str, list[str]] = {}
    if path and secret:
        errors["kubeconfig_secret"] = ["Name a kubeconfig_path or a kubeconfig_secret, not both."]
    if path and not PurePosixPath(path).is_absolute():
        errors["kubeconfig_path"] = ["An absolute path on the scheduler's host."]
    if secret and not SECRET_KEY.match(secret):
        errors["kubeconfig_secret"] = ["A file name in the mounted Secret (no '/')."]
    if backend == ClusterBackendKind.SIMULATED and (path or secret or fields.get("kube_context")):
        errors["backend"] = ["A simulated cluster takes no kubeconfig or context."]
    if backend == ClusterBackendKind.KUBERNETES and not home and not (path or secret):
        errors["kubeconfig_path"] = ["A Kubernetes cluster names its kubeconfig_path or secret."]
    return errors


def _validate(fields: dict[str, Any], *, backend: str, home: bool) -> None:
    errors = _credential_errors(fields, backend, home)
    if "labels" in fields and (problems := _labels_errors(fields["labels"])):
        errors["labels"] = problems
    lost = fields.get("lost_after_s")
    if lost is not None and not (isinstance(lost, int) and 10 <= lost <= 7 * 86400):
        errors["lost_after_s"] = ["Seconds from 10 to 604800, or null for the default."]
    if errors:
        raise ValidationError(errors)


def cluster_create(
    *, user: Any, name: str, backend: str, labels: dict[str, str] | None = None, **fields: Any
) -> Cluster:
    """A new cluster, active. Raises ValidationError (nothing made) or ConflictError (the
    name is taken)."""
    access.require_platform_admin(user)
    errors: dict[str, list[str]] = {}
    if not DNS_LABEL.match(name or ""):
        errors["name"] = ["1-63 lowercase letters, digits or '-', a letter or digit at each end."]
    if backend not in ClusterBackendKind.values:
        errors["backend"] = [f"{str(backend)[:30]!r}: simulated or kubernetes."]
    if errors:
        raise ValidationError(errors)
    unknown = set(fields) - set(EDITABLE)
    if unknown:
        raise ValidationError({key: ["Not a field of a cluster."] for key in sorted(unknown)})
    fields = {"labels": labels or {}, **fields}
    _validate(fields, backend=backend, home=False)
    with transaction.atomic():
        if Cluster.objects.filter(name=name).exists():
            raise ConflictError(f"A cluster named {name!r} exists.")
        cluster = Cluster.objects.create(name=name, backend=backend, **fields)
        audit_record(
            actor=user,
            action="cluster.create",
            tenant=None,
            target=cluster,
            before=None,
            after=audit_snapshot(cluster),
        )
    return cluster


def cluster_update(*, user: Any, cluster: Cluster, **fields: Any) -> Cluster:
    """Change what `EDITABLE` names (not the name, the backend or the state)."""
    access.require_platform_admin(user)
    fixed = set(fields) - set(EDITABLE)
    if fixed:
        raise ValidationError({key: ["Cannot be changed."] for key in sorted(fixed)})
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        merged = {key: getattr(locked, key) for key in EDITABLE} | fields
        _validate(merged, backend=locked.backend, home=locked.home)
        before = audit_snapshot(locked, fields)
        for key, value in fields.items():
            setattr(locked, key, value)
        locked.save()
        audit_record(
            actor=user,
            action="cluster.update",
            tenant=None,
            target=locked,
            before=before,
            after=audit_snapshot(locked, fields),
        )
    return locked


def cluster_set_cordoned(*, user: Any, cluster: Cluster, cordoned: bool) -> Cluster:
    """Cordon (nothing new placed there) or make active again. A lost cluster stays lost
    until it answers (uncordon: ConflictError); cordoned while lost, it is cordoned when it
    answers."""
    access.require_platform_admin(user)
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if locked.state == ClusterState.LOST and not cordoned:
            raise ConflictError(
                f"Cluster {locked.name} is lost: it becomes active when it answers again."
            )
        before = {"state": locked.state, "cordoned": locked.cordoned}
        locked.cordoned = cordoned
        if locked.state != ClusterState.LOST:
            locked.state = ClusterState.CORDONED if cordoned else ClusterState.ACTIVE
        after = {"state": locked.state, "cordoned": locked.cordoned}
        if before != after:
            locked.save(update_fields=["state", "cordoned", "updated_at"])
            audit_record(
                actor=user,
                action="cluster.cordon" if cordoned else "cluster.uncordon",
                tenant=None,
                target=locked,
                before=before,
                after=after,
            )
    return locked


def cluster_delete(*, user: Any, cluster: Cluster) -> None:
    """Remove a cluster that never had nodes (a mistyped one). The home cluster, and one whose
    nodes Gantry has seen, stay (ConflictError): their nodes' history refers to them."""
    access.require_platform_admin(user)
    with transaction.atomic():
        locked = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if locked.home:
            raise ConflictError("The home cluster cannot be removed.")
        if locked.nodes.exists():
            raise ConflictError(
                f"Cluster {locked.name} has nodes: cordon it instead; its nodes keep their history."
            )
        audit_record(
            actor=user,
            action="cluster.delete",
            tenant=None,
            target=locked,
            before=audit_snapshot(locked),
            after=None,
        )
        locked.delete()


def clusters_seen(
    *, answered: dict[str, bool], now: datetime, default_lost_after_s: float
) -> set[str]:
    """The daemon's record, once per sync: a cluster that answered is seen now (and, if it was
    lost, active again, or cordoned if an admin cordoned it); one that did not for longer than
    its `lost_after_s` is lost.
    Returns the names that became lost now."""
    lost_now: set[str] = set()
    with transaction.atomic():
        for cluster in Cluster.objects.select_for_update().filter(name__in=list(answered)):
            if answered[cluster.name]:
                cluster.last_seen_at = now
                if cluster.state == ClusterState.LOST:
                    back = ClusterState.CORDONED if cluster.cordoned else ClusterState.ACTIVE
                    cluster.state = back
                cluster.save(update_fields=["last_seen_at", "state", "updated_at"])
                continue
            deadline = cluster.lost_after_s or default_lost_after_s
            seen = cluster.last_seen_at or cluster.created_at
            if cluster.state != ClusterState.LOST and (now - seen).total_seconds() > deadline:
                cluster.state = ClusterState.LOST
                cluster.save(update_fields=["state", "updated_at"])
                lost_now.add(cluster.name)
    return lost_now
