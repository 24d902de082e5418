"""`FederatedBackend`: the backend contract over several clusters' backends.

Reads list every member and qualify what they list (`naming`): node names and their labels
(`gantry.io/cluster`, and the cluster's `gantry.io/region` and `gantry.io/site`), pods'
nodes. Writes go to the member of the pod's node, with the node's own name. A project's
namespace is made in a cluster before its first pod there by the member itself (the
Kubernetes backend checks or creates it once per namespace and process: `_require_own_namespace`).

Failures are a member's own: a member whose list fails does not fail the others'. Its nodes
are reported as last listed, unschedulable, and its pods as last listed: what ran there is
still charged and held, never taken for gone (a cluster that does not answer is not a
finished job). Once the daemon marks it lost (`lost`, past its `lost_after_s`), its nodes
are reported NotReady: the daemon fails their jobs' attempts as on any lost node, and each
is retried elsewhere per its retry policy (docs/multicluster.md, "A lost cluster").

A member never listed since this process started is reported as the caller seeded it
(`seed`: what the database holds), else as empty. A member that failed is asked again only
`probe_every_s` later. `answered` says, per cluster, whether its last list answered; the
daemon records it (`scheduler.clusters.backends.ClusterWatch`).

Capabilities (`scheduler.backends.base`): `federate` builds a class with those its members
offer, each forwarded: fenced writes always (members that fence their tries get the check),
concurrent writes when any member takes them (the others serialised by a lock each),
pod watching, the event clock, inference load, fault injection and device readings when
any member offers them.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.backends.base import (
    BackendError,
    ClusterBackend,
    ConcurrentWrites,
    FencedWrites,
    NodeInfo,
    PodRequest,
    PodStatus,
)
from scheduler.backends.federated.capabilities import MIXINS
from scheduler.backends.federated.naming import qualified, split
from scheduler.core.clusters import CLUSTER_LABEL, REGION_LABEL, SITE_LABEL

log = logging.getLogger("gantry.daemon")
PROBE_EVERY_S = 10.0  # how often a cluster that does not answer is asked again


@dataclass(frozen=True)
class Member:
    """One cluster: its name, backend, whether it is home (plain node names) and its
    region/site labels (`Cluster.labels`)."""

    name: str
    backend: ClusterBackend
    home: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)

    def node_labels(self) -> dict[str, str]:
        keys = {"region": REGION_LABEL, "site": SITE_LABEL}
        out = {keys[k]: v for k, v in self.labels.items() if k in keys}
        return {CLUSTER_LABEL: self.name, **out}


@dataclass
class Seen:
    """What a member listed last (or was seeded with)."""

    nodes: tuple[NodeInfo, ...] = ()
    pods: tuple[PodStatus, ...] = ()


class FederatedBackend:
    def __init__(
        self,
        members: Sequence[Member],
        *,
        seed: Mapping[str, Seen] | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_every_s: float = PROBE_EVERY_S,
    ) -> None:
        if sum(m.home for m in members) > 1:
            raise ValueError("at most one home cluster")
        self.members = {m.name: m for m in members}
        self.home = next((m.name for m in members if m.home), "")
        self.seen: dict[str, Seen] = {m.name: Seen() for m in members}
        self.seen.update(seed or {})
        self.answered: dict[str, bool] = {}
        # The clusters the daemon marked lost (past their deadline): `ClusterWatch` sets it.
        self.lost: set[str] = set()
        self.clock, self.probe_every_s = clock, probe_every_s
        self._quiet_until: dict[str, float] = {}  # a silent member is asked again from then
        # A member whose writes are not safe from several threads, when others' are sent
        # concurrently (the daemon's call pool): one write at a time each.
        self._locks = {m.name: threading.Lock() for m in members}
        # A member that takes concurrent writes takes at most its own `max_in_flight`: the
        # daemon's pool holds the members' sum, and a cycle's writes may all go to one member
        # (beyond its connection pool, each call would open and drop a connection of its own).
        self._slots = {
            m.name: threading.BoundedSemaphore(m.backend.max_in_flight)
            for m in members
            if isinstance(m.backend, ConcurrentWrites)
        }

    def reseed(self, seed: Mapping[str, Seen]) -> None:
        """A new leadership term starts from `seed` (what the database holds: `last_known`):
        each seeded member is held so until it answers, and asked at once. This process's
        own memory of a member dates from before it last led and lacks what other leaders
        placed there since: a silent member held as that reports their pods vanished, and
        the daemon fails their jobs before the member's deadline."""
        for name, seen in seed.items():
            if name in self.members:
                self.seen[name] = seen
                self.answered.pop(name, None)
                self._quiet_until.pop(name, None)

    # -- routing -------------------------------------------------------------------------

    def member_of(self, node: str) -> tuple[Member, str]:
        """The member holding qualified node `node`, and the node's own name there."""
        cluster, name = split(node, self.home)
        member = self.members.get(cluster)
        if member is None:
            raise BackendError(f"node {node}: no cluster {cluster!r} is driven")
        return member, name

    def _write(self, member: Member, call: Callable[[], None]) -> None:
        """`call` to `member`; refused at once (BackendError) while the member is in its quiet
        time after a failed list: a silent cluster's timeouts must not slow every cycle."""
        if self.clock() < self._quiet_until.get(member.name, -math.inf):
            raise BackendError(f"cluster {member.name} does not answer")
        with self._slots.get(member.name) or self._locks[member.name]:
            call()

    # -- reads ---------------------------------------------------------------------------

    def _read(self, member: Member, read: Callable[[], Any]) -> Any | None:
        """`read()` of one member, None when it fails (logged): the others go on. A member
        that failed is asked again only `probe_every_s` later, so that a silent cluster (each
        call its backend's retries and timeouts long) does not slow every cycle."""
        if self.clock() < self._quiet_until.get(member.name, -math.inf):
            return None
        try:
            got = read()
        except Exception as error:  # any failure of one cluster is that cluster's
            if self.answered.get(member.name, True):
                log.warning("cluster %s does not answer: %s", member.name, error)
            self.answered[member.name] = False
            self._quiet_until[member.name] = self.clock() + self.probe_every_s
            return None
        self.answered[member.name] = True
        self._quiet_until.pop(member.name, None)
        return got

    def list_nodes(self) -> Sequence[NodeInfo]:
        out: list[NodeInfo] = []
        for member in self.members.values():
            nodes = self._read(member, member.backend.list_nodes)
            seen = self.seen[member.name]
            if nodes is not None:
                seen.nodes = tuple(self._qualify_node(member, n) for n in nodes)
                out.extend(seen.nodes)
            else:
                out.extend(self._held(member.name, n) for n in seen.nodes)
        return out

    def _held(self, cluster: str, node: NodeInfo) -> NodeInfo:
        """A silent cluster's node as last listed: unschedulable (nothing new goes there) but
        ready while the cluster is not lost, so that what runs there stays held (the daemon
        fails the jobs of a NotReady node at once); NotReady once it is lost (its jobs are
        then retried elsewhere per their policy)."""
        return replace(node, unschedulable=True, ready=node.ready and cluster not in self.lost)

    def _qualify_node(self, member: Member, node: NodeInfo) -> NodeInfo:
        return replace(
            node,
            name=qualified(member.name, node.name, home=member.home),
            labels={**node.labels, **member.node_labels()},
        )

    def list_pods(self) -> Sequence[PodStatus]:
        out: list[PodStatus] = []
        for member in self.members.values():
            pods = self._read(member, member.backend.list_pods)
            seen = self.seen[member.name]
            if pods is not None:
                seen.pods = tuple(
                    p
                    if p.node is None
                    else replace(p, node=qualified(member.name, p.node, home=member.home))
                    for p in pods
                )
            out.extend(seen.pods)
        return out

    # -- writes --------------------------------------------------------------------------

    def create_pod(self, pod: PodRequest) -> None:
        member, node = self.member_of(pod.node)
        local = replace(pod, node=node)

        def create() -> None:
            member.backend.create_pod(local)
            if self.creates_bound and not _creates_bound(member.backend):
                member.backend.bind_pod(local.namespace, local.name, node)

        self._write(member, create)

    def bind_pod(self, namespace: str, name: str, node: str) -> None:
        member, local = self.member_of(node)
        self._write(member, lambda: member.backend.bind_pod(namespace, name, local))

    def delete_pod(self, namespace: str, name: str, grace_period_s: int = 30) -> None:
        """Delete in the cluster that last listed the pod; one never listed (or listed by
        none that answered) is deleted wherever it may be, each member's failure its own."""
        holders = [
            m
            for m in self.members.values()
            if any(p.name == name and p.namespace == namespace for p in self.seen[m.name].pods)
        ]
        errors: list[BackendError] = []
        for member in holders or list(self.members.values()):

            def delete(backend: ClusterBackend = member.backend) -> None:
                backend.delete_pod(namespace, name, grace_period_s)

            try:
                self._write(member, delete)
            except BackendError as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def set_node_unschedulable(self, node: str, unschedulable: bool) -> None:
        """Mirrored to the node's cluster; skipped for a cluster that did not answer its last
        list: its nodes are reported not ready, so nothing is placed there anyway, and a
        failure here would stop the daemon's node duties for every cluster."""
        member, local = self.member_of(node)
        if not self.answered.get(member.name, True):
            log.info("cordon of %s skipped: cluster %s does not answer", node, member.name)
            return
        self._write(member, lambda: member.backend.set_node_unschedulable(local, unschedulable))

    @property
    def creates_bound(self) -> bool:
        return any(_creates_bound(m.backend) for m in self.members.values())

    def fenced(self, check: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        return _fenced_all([m.backend for m in self.members.values()], check)


def _creates_bound(backend: ClusterBackend) -> bool:
    return isinstance(backend, ConcurrentWrites) and backend.creates_bound


@contextlib.contextmanager
def _fenced_all(backends: Sequence[ClusterBackend], check: Callable[[], None]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for backend in backends:
            if isinstance(backend, FencedWrites):
                stack.enter_context(backend.fenced(check))
        yield


def federate(members: Sequence[Member], **options: Any) -> FederatedBackend:
    """A FederatedBackend with the capabilities (`capabilities.MIXINS`) its members offer;
    `options` are FederatedBackend's."""
    mixins = tuple(
        mixin for protocol, mixin in MIXINS if any(isinstance(m.backend, protocol) for m in members)
    )
    cls = type("FederatedBackend", (*mixins, FederatedBackend), {}) if mixins else FederatedBackend
    return cls(members, **options)
