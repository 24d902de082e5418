"""Pod logs across clusters: each read goes to the log source of the cluster of the pod's node
(`LogTarget.node`, named as `naming` says). The web and API processes build it with
`scheduler.clusters.backends.log_source` when there are several clusters."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime

from scheduler.backends.base import BackendError, LogLine, LogPage, LogSource, LogTarget
from scheduler.backends.federated.naming import split


class FederatedLogs:
    def __init__(self, sources: Mapping[str, LogSource], home: str) -> None:
        self.sources, self.home = dict(sources), home

    def _source(self, target: LogTarget) -> LogSource:
        cluster, _ = split(target.node, self.home)
        source = self.sources.get(cluster)
        if source is None:
            raise BackendError(f"the log of {target.pod} is in cluster {cluster!r}, not driven")
        return source

    def read_log(
        self, target: LogTarget, *, now: datetime, tail: int | None = None, cursor: str = ""
    ) -> LogPage:
        return self._source(target).read_log(target, now=now, tail=tail, cursor=cursor)

    def follow_log(self, target: LogTarget, *, tail: int | None = None) -> Iterator[LogLine]:
        return self._source(target).follow_log(target, tail=tail)
