"""The projects' namespaces, made ahead of their first pod (the daemon's sync phase).

A Kubernetes user creates workloads in their project's namespace (docs/kubernetes-native.md):
it must exist before `kubectl apply` can. The backend makes a namespace with a job's first
pod; on a backend whose users create workloads themselves (`ProjectNamespaces`), the daemon
makes every project's at its node sync instead, so a project made in the portal can be used
from Kubernetes at once. A namespace someone else made (not labelled as Gantry's) is left
alone and said once: a platform admin assigns it (docs/kubernetes.md).
"""

from __future__ import annotations

import functools
import logging

from scheduler.backends.base import BackendError, ProjectNamespaces
from scheduler.daemon.cluster import Cluster
from tenants.models import Project

log = logging.getLogger("gantry.daemon")


def prepare_namespaces(cluster: Cluster, ready: set[str], refused: set[str]) -> int:
    """Make each project's namespace not made yet by this daemon (`ready`, kept by the
    caller); one another owner holds is skipped and logged once (`refused`). Returns how
    many were made or found Gantry's now. A failed call leaves the rest for the next sync."""
    backend = cluster.backend
    if not isinstance(backend, ProjectNamespaces):
        return 0
    wanted = set(Project.objects.values_list("namespace", flat=True)) - ready
    done = 0
    for name in sorted(wanted):
        try:
            cluster.call(functools.partial(backend.prepare_namespace, name))
        except BackendError as error:
            if backend.foreign(error):
                if name not in refused:
                    refused.add(name)
                    log.warning("project namespace %s not made: %s", name, error)
                continue
            log.warning("project namespaces not made yet (next sync tries again): %s", error)
            return done
        refused.discard(name)
        ready.add(name)
        done += 1
    return done
