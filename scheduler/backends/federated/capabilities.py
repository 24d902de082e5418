"""The capabilities a `FederatedBackend` forwards, one mixin each: `federate` adds those its
members offer, so the daemon's `isinstance` checks see exactly what some member can do."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from scheduler.backends.base import (
    BackendError,
    ConcurrentWrites,
    DeviceUtilization,
    EventClock,
    FaultInjection,
    InferenceLoad,
    PodWatching,
    ProjectNamespaces,
    UtilizationSource,
)
from scheduler.backends.federated.naming import qualified

if TYPE_CHECKING:
    from scheduler.backends.federated.backend import FederatedBackend

    _Base = FederatedBackend
else:
    _Base = object

# How often a forwarding thread looks again at `stop` while its member is quiet.
FORWARD_POLL_S = 1.0


class ForwardsConcurrentWrites(_Base):
    @property
    def max_in_flight(self) -> int:
        """Each member's own (1 for one called in order, under its lock)."""
        return sum(
            m.backend.max_in_flight if isinstance(m.backend, ConcurrentWrites) else 1
            for m in self.members.values()
        )


class ForwardsPodWatching(_Base):
    def watch_pods(self, stop: threading.Event) -> threading.Event:
        """One event set whenever any watching member's is: a thread per member forwards."""
        changed = threading.Event()
        for member in self.members.values():
            if not isinstance(member.backend, PodWatching):
                continue
            theirs = member.backend.watch_pods(stop)

            def forward(theirs: threading.Event = theirs) -> None:
                while not stop.is_set():
                    if theirs.wait(FORWARD_POLL_S):
                        theirs.clear()
                        changed.set()

            threading.Thread(
                target=forward, name=f"gantry-watch-{member.name}", daemon=True
            ).start()
        return changed

    def close_watches(self) -> None:
        for member in self.members.values():
            if isinstance(member.backend, PodWatching):
                member.backend.close_watches()


class ForwardsEventClock(_Base):
    def next_event_at(self) -> float | None:
        """The earliest of the members' that answered their last list. A silent member's pods
        cannot be seen to end: a pod due to end there would read as an event already past at
        every cycle, and the daemon would cycle without pause until the member answered. It
        is asked again on its own schedule (`probe_every_s`) at the daemon's interval."""
        times = [
            at
            for m in self.members.values()
            if isinstance(m.backend, EventClock)
            and self.answered.get(m.name, True)
            and (at := m.backend.next_event_at()) is not None
        ]
        return min(times, default=None)


class ForwardsInferenceLoad(_Base):
    def inference_load(self, job_id: int) -> float:
        """The member's whose pods the job has (as last listed), else the first that tells."""
        for name, seen in self.seen.items():
            backend = self.members[name].backend
            if isinstance(backend, InferenceLoad) and any(p.job_id == job_id for p in seen.pods):
                return backend.inference_load(job_id)
        for member in self.members.values():
            if isinstance(member.backend, InferenceLoad):
                return member.backend.inference_load(job_id)
        return 0.0


class ForwardsFaultInjection(_Base):
    """A member that cannot fail nodes (a real cluster) ignores the request."""

    def fail_node(self, node: str, message: str = "failed by an admin (simulated)") -> None:
        member, local = self.member_of(node)
        if isinstance(member.backend, FaultInjection):
            member.backend.fail_node(local, message)

    def heal_node(self, node: str) -> None:
        member, local = self.member_of(node)
        if isinstance(member.backend, FaultInjection):
            member.backend.heal_node(local)

    def node_failed(self, node: str) -> bool:
        member, local = self.member_of(node)
        return isinstance(member.backend, FaultInjection) and member.backend.node_failed(local)


class ForwardsUtilization(_Base):
    def device_readings(self) -> Sequence[DeviceUtilization]:
        out: list[DeviceUtilization] = []
        for member in self.members.values():
            if not isinstance(member.backend, UtilizationSource):
                continue
            readings = self._read(member, member.backend.device_readings)
            for r in readings or ():
                out.append(replace(r, node=qualified(member.name, r.node, home=member.home)))
        return out


class ForwardsProjectNamespaces(_Base):
    def prepare_namespace(self, name: str) -> None:
        """The namespace made in every member whose users create their own workloads; each
        member's failure its own, the first raised once all were tried (the daemon tries
        again at its next node sync: making one is idempotent)."""
        errors: list[BackendError] = []
        for member in self.members.values():
            backend = member.backend
            if not isinstance(backend, ProjectNamespaces):
                continue
            try:
                self._write(member, functools.partial(backend.prepare_namespace, name))
            except BackendError as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def foreign(self, error: BackendError) -> bool:
        return any(
            isinstance(m.backend, ProjectNamespaces) and m.backend.foreign(error)
            for m in self.members.values()
        )


MIXINS = (
    (ConcurrentWrites, ForwardsConcurrentWrites),
    (PodWatching, ForwardsPodWatching),
    (EventClock, ForwardsEventClock),
    (InferenceLoad, ForwardsInferenceLoad),
    (FaultInjection, ForwardsFaultInjection),
    (UtilizationSource, ForwardsUtilization),
    (ProjectNamespaces, ForwardsProjectNamespaces),
)
