"""Pod logs with several clusters: each read goes to the cluster of the pod's node."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler.backends import factory
from scheduler.backends.base import BackendError, LogLine, LogPage, LogTarget
from scheduler.backends.federated.logs import FederatedLogs
from scheduler.clusters.backends import log_source
from scheduler.models import Cluster

T0 = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


class Recording:
    def __init__(self, name: str) -> None:
        self.name, self.read = name, []

    def read_log(
        self, target: LogTarget, *, now: datetime, tail: int | None = None, cursor: str = ""
    ) -> LogPage:
        self.read.append(target.pod)
        return LogPage((LogLine(None, f"from {self.name}"),), "c")

    def follow_log(self, target: LogTarget, *, tail: int | None = None) -> Iterator[LogLine]:
        yield LogLine(None, f"from {self.name}")


def target(node: str) -> LogTarget:
    return LogTarget("proj", "gantry-1-a0-r0", 1, 0, 0, "training", T0, None, node=node)


def test_each_read_goes_to_the_cluster_of_the_pods_node() -> None:
    home, b = Recording("local"), Recording("b")
    logs = FederatedLogs({"local": home, "b": b}, home="local")
    assert logs.read_log(target("b:n1"), now=T0).lines[0].text == "from b"
    assert logs.read_log(target("n1"), now=T0).lines[0].text == "from local"
    assert [line.text for line in logs.follow_log(target("b:n1"))] == ["from b"]
    with pytest.raises(BackendError, match="cluster 'c'"):
        logs.read_log(target("c:n1"), now=T0)


@pytest.mark.django_db
def test_the_web_reads_through_the_home_source_alone_until_there_are_several_clusters(
    settings: Any,
) -> None:
    settings.GANTRY_CLUSTER_BACKEND = "simulated"
    factory._log_source.cache_clear()
    assert log_source() is factory.log_source()
    Cluster.objects.create(name="b", backend="simulated")
    several = log_source()
    assert isinstance(several, FederatedLogs) and sorted(several.sources) == ["b", "local"]
    assert several.read_log(target("b:n1"), now=T0).lines  # the simulated cluster's log
