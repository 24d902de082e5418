"""Several clusters as the engine sees them: the labels every node carries (docs/multicluster.md).

A node's cluster is its `CLUSTER_LABEL` value; nodes without it are one cluster (""). A gang
never spans two values (``scheduler.core.placement``); a job may require clusters or regions
and prefer clusters (``JobRequest.clusters``, ``.regions``, ``.preferred_clusters``).

A job may also name clusters by their labels (`Cluster.labels`: region, site, and whatever an
admin marks, such as the data a cluster holds): `cluster_labels` a cluster must carry, every
one, and `preferred_cluster_labels` that make a cluster preferred. `resolve_placement` turns
them into the names above from the clusters' labels, before the engine sees the job, so the
engine has one rule for where a job may run and where it would rather.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CLUSTER_LABEL = "gantry.io/cluster"
REGION_LABEL = "gantry.io/region"
SITE_LABEL = "gantry.io/site"
# A required cluster no cluster can be named (cluster names are DNS labels): a job whose
# labels no cluster carries may run nowhere, and waits saying so.
NO_CLUSTER = "(no cluster with the labels asked)"

Labels = Mapping[str, str]


def carrying(clusters: Mapping[str, Labels], selector: Labels) -> tuple[str, ...]:
    """The names of the clusters (name -> labels) whose labels hold every pair of `selector`,
    in name order."""
    return tuple(
        sorted(
            name
            for name, labels in clusters.items()
            if all(labels.get(key) == value for key, value in selector.items())
        )
    )


def resolve_placement(
    placement: Mapping[str, Any], clusters: Mapping[str, Labels]
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The clusters a job may run in (empty: any) and those it prefers, from its `placement`
    (a job spec's) and the clusters Gantry drives (name -> labels).

    Required: the clusters named, narrowed to those carrying `cluster_labels`; none left:
    `NO_CLUSTER`. Preferred: the clusters named, then those carrying
    `preferred_cluster_labels` (within the required ones, which alone may run the job).
    With one cluster its nodes carry no cluster label (the backend is not a federation, and
    the engine sees one unnamed cluster): a requirement it meets is dropped, one it fails
    leaves `NO_CLUSTER`, and preferences go."""
    required = tuple(placement.get("clusters") or ())
    selector = placement.get("cluster_labels") or {}
    if selector:
        matching = set(carrying(clusters, selector))
        required = tuple(n for n in (required or sorted(matching)) if n in matching) or (
            NO_CLUSTER,
        )
    preferred = list(placement.get("preferred_clusters") or ())
    wished = placement.get("preferred_cluster_labels") or {}
    if wished:
        preferred += [n for n in carrying(clusters, wished) if n not in preferred]
    if required and NO_CLUSTER not in required:
        preferred = [n for n in preferred if n in required]
    if len(clusters) == 1:
        if required and NO_CLUSTER not in required and set(required) & set(clusters):
            required = ()
        elif required:
            required = (NO_CLUSTER,)
        preferred = []
    return required, tuple(preferred)
