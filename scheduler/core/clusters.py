"""Several clusters as the engine sees them: the labels every node carries (docs/multicluster.md).

A node's cluster is its `CLUSTER_LABEL` value; nodes without it are one cluster (""). A gang
never spans two values (``scheduler.core.placement``); a job may require clusters or regions
and prefer clusters (``JobRequest.clusters``, ``.regions``, ``.preferred_clusters``).
"""

from __future__ import annotations

CLUSTER_LABEL = "gantry.io/cluster"
REGION_LABEL = "gantry.io/region"
SITE_LABEL = "gantry.io/site"
