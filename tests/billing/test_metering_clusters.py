"""Metering records the cluster of each allocation hour (issue 38): the name of the cluster
of the allocation's node; a node without a cluster is the home cluster's."""

from __future__ import annotations

from billing.metering.hourly import meter_usage
from billing.models import UsageRecord
from scheduler.models import Cluster
from tests.billing.builders import at, hold, job_for, make_node
from tests.conftest import Org


def test_each_usage_record_names_its_nodes_cluster(org: Org) -> None:
    """On PostgreSQL the records are written by COPY, on SQLite by bulk_create: the SQLite
    pass of the suite covers the second."""
    site_b = Cluster.objects.create(name="site-b", backend="simulated")
    home = Cluster.objects.get(home=True)
    on_b = make_node("site-b:n1")
    on_b.cluster = site_b
    on_b.save(update_fields=["cluster"])
    without = make_node("n2")  # a node a release before clusters inserted: the home cluster's
    without.cluster = None
    without.save(update_fields=["cluster"])
    first = hold(job_for(org), on_b, 0, 1, [1000])
    second = hold(job_for(org), without, 0, 1, [1000])
    assert meter_usage(now=at(2)) == 1
    assert dict(UsageRecord.objects.values_list("allocation_id", "cluster")) == {
        first.pk: "site-b",
        second.pk: home.name,
    }
