"""The daemon's small pieces of state, each passed to the functions that need it: its clock,
its timers, what it remembers of the nodes, its limits and its test hooks. The loop owns
them; no function writes attributes onto the loop."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings


@dataclass
class Clock:
    """The daemon's time, injectable so that tests never wait on the wall clock."""

    now: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep

    def dt(self) -> datetime:
        return datetime.fromtimestamp(self.now(), tz=UTC)


class Every:
    """A duty done at most every `seconds` of the daemon's clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = -math.inf

    def due(self, now: float) -> bool:
        """True, and counted as done now, when `seconds` passed since it was last done."""
        if now - self.at < self.seconds:
            return False
        self.at = now
        return True


@dataclass
class NodeMemory:
    """What the daemon remembers of the nodes between cycles."""

    # The inventory as last written (node name -> fingerprint): unchanged, nothing is written.
    prints: dict[str, Any] = field(default_factory=dict)
    # The nodes as last listed, with their fingerprints (name -> (NodeInfo, fingerprint)).
    listed: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    # Nodes this daemon cordoned in the cluster (it uncordons only those).
    cordons: set[str] = field(default_factory=set)
    # Node name -> when (daemon clock) reconcile first saw it NotReady or gone.
    down: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Limits:
    """How long and how often the daemon tries before it gives up on a pod or a node."""

    bind_attempts: int
    binding_timeout_s: float
    node_lost_grace_s: float
    call_deadline_s: float = 15.0  # a create or bind without an answer: given up (bind.py)

    @classmethod
    def from_settings(
        cls,
        bind_attempts: int | None = None,
        binding_timeout_s: float | None = None,
        node_lost_grace_s: float | None = None,
    ) -> Limits:
        return cls(
            bind_attempts or settings.GANTRY_BIND_ATTEMPTS,
            binding_timeout_s or settings.GANTRY_BINDING_TIMEOUT_S,
            settings.GANTRY_NODE_LOST_GRACE_S if node_lost_grace_s is None else node_lost_grace_s,
            settings.GANTRY_CALL_DEADLINE_S,
        )


# A test hook by name (`Daemon.hook`): "claimed", "pods_created", "bound", "before_commit".
Hook = Callable[[str], None]
