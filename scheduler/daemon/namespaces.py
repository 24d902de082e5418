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
# Namespaces made per node sync at most: a new leader of an installation with hundreds of
# projects (several calls each: the namespace, its policies, its RoleBinding) must not hold
# its first cycles for them; the rest follow at the next syncs.
PER_SYNC = 20


def prepare_namespaces(
    cluster: Cluster, ready: set[str], refused: set[str], per_sync: int = PER_SYNC
) -> int:
    """Make the projects' namespaces not made yet by this daemon (`ready`, kept by the
    caller), `per_sync` at most; one another owner holds is skipped and logged once
    (`refused`). Returns how many were made or found Gantry's now. A failed call leaves the
    rest for the next sync."""
    backend = cluster.backend
    if not isinstance(backend, ProjectNamespaces):
        return 0
    wanted = set(Project.objects.values_list("namespace", flat=True)) - ready
    done = 0
    # Those another owner held at the last try go last: they must not take every turn.
    for name in sorted(wanted, key=lambda n: (n in refused, n))[:per_sync]:
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
