"""The scheduling profile: data, validated when loaded.

``Profile.from_dict`` accepts the shape below; every key is optional and defaults as in
``Profile``. Any unknown key, unknown plugin or bad number raises ``ProfileError`` naming it::

    {"name": "default",
     "plugins": {"score": {"FragmentationScore": 2, "GpuFit": 1, "TopologyScore": 1}},
     "order": {"guaranteed_first": true},
     "fair_share": {"half_life_s": 86400, "history_weight": 0.5},
     "aging": {"per_hour": 10, "max_boost": 1000},
     "preemption": {"min_runtime_s": 300, "critical_overrides_min_runtime": true,
                    "ping_pong_guard_s": 900, "reclaim_any_priority": true,
                    "max_candidates": 256},
     "backfill": {"enabled": true, "unknown_runtime_s": 86400},
     "placement": {"max_scored_nodes": 128, "fragmentation_step_milli": 100}}

``guaranteed_first`` orders jobs that fit in their tenant's guarantee before jobs that would
borrow, then by priority (as Kueue orders its queue heads): capacity freed by reclaiming a
guarantee goes to the reclaimer, not back to a higher-priority borrower.
``max_scored_nodes`` bounds how many feasible nodes are scored per replica (as
kube-scheduler's percentageOfNodesToScore): the best-fitting ones, in node order.
``fragmentation_step_milli`` is how coarsely ``FragmentationScore`` compares the fragmentation
a placement adds (see ``scoring``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

SCORE_PLUGINS = ("FragmentationScore", "GpuFit", "TopologyScore")


class ProfileError(ValueError):
    """A profile that cannot be used; the message names the offending key or plugin."""


@dataclass(frozen=True, slots=True)
class Profile:
    name: str = "default"
    score_weights: Mapping[str, float] = field(
        default_factory=lambda: {"FragmentationScore": 2.0, "GpuFit": 1.0, "TopologyScore": 1.0}
    )
    guaranteed_first: bool = True
    half_life_s: float = 86_400.0
    history_weight: float = 0.5
    aging_per_hour: float = 10.0
    aging_max_boost: float = 1_000.0
    min_runtime_s: float = 300.0
    critical_overrides_min_runtime: bool = True
    ping_pong_guard_s: float = 900.0
    reclaim_any_priority: bool = True
    max_preemption_candidates: int = 256
    backfill: bool = True
    unknown_runtime_s: float = 86_400.0
    max_scored_nodes: int = 128
    fragmentation_step_milli: float = 100.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Profile:
        _only_keys("profile", data, {"name", "plugins", *_SECTIONS})
        values: dict[str, Any] = {}
        if "name" in data:
            values["name"] = _text("name", data["name"])
        if "plugins" in data:
            values["score_weights"] = _score_weights(data["plugins"])
        for section, spec in _SECTIONS.items():
            body = data.get(section, {})
            _only_keys(section, body, set(spec))
            for key, (attr, kind) in spec.items():
                if key in body:
                    values[attr] = _check(f"{section}.{key}", body[key], kind)
        return cls(**values)


# section -> key -> (Profile attribute, kind); kinds: "pos" > 0, "nonneg" >= 0,
# "unit" in [0, 1], "bool", "count" positive int.
_SECTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "order": {"guaranteed_first": ("guaranteed_first", "bool")},
    "fair_share": {
        "half_life_s": ("half_life_s", "pos"),
        "history_weight": ("history_weight", "unit"),
    },
    "aging": {"per_hour": ("aging_per_hour", "nonneg"), "max_boost": ("aging_max_boost", "nonneg")},
    "preemption": {
        "min_runtime_s": ("min_runtime_s", "nonneg"),
        "critical_overrides_min_runtime": ("critical_overrides_min_runtime", "bool"),
        "ping_pong_guard_s": ("ping_pong_guard_s", "nonneg"),
        "reclaim_any_priority": ("reclaim_any_priority", "bool"),
        "max_candidates": ("max_preemption_candidates", "count"),
    },
    "backfill": {
        "enabled": ("backfill", "bool"),
        "unknown_runtime_s": ("unknown_runtime_s", "pos"),
    },
    "placement": {
        "max_scored_nodes": ("max_scored_nodes", "count"),
        "fragmentation_step_milli": ("fragmentation_step_milli", "pos"),
    },
}


def _score_weights(plugins: Any) -> dict[str, float]:
    if not isinstance(plugins, Mapping):
        raise ProfileError("plugins: expected a mapping")
    _only_keys("plugins", plugins, {"score"})
    score = plugins.get("score", {})
    if not isinstance(score, Mapping):
        raise ProfileError("plugins.score: expected a mapping of plugin name to weight")
    weights: dict[str, float] = {}
    for name, weight in score.items():
        if name not in SCORE_PLUGINS:
            known = ", ".join(SCORE_PLUGINS)
            raise ProfileError(f"plugins.score: unknown plugin {name!r} (known: {known})")
        weights[name] = _check(f"plugins.score.{name}", weight, "nonneg")
    if not any(weights.values()):
        raise ProfileError("plugins.score: at least one plugin needs a positive weight")
    return weights


def _only_keys(where: str, body: Any, allowed: set[str]) -> None:
    if not isinstance(body, Mapping):
        raise ProfileError(f"{where}: expected a mapping")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r}")


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ProfileError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _check(where: str, value: Any, kind: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            raise ProfileError(f"{where}: expected true or false, got {value!r}")
        return value
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProfileError(f"{where}: expected a positive integer, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ProfileError(f"{where}: expected a finite number, got {value!r}")
    bad = (
        (kind == "pos" and value <= 0)
        or (kind == "nonneg" and value < 0)
        or (kind == "unit" and not 0 <= value <= 1)
    )
    if bad:
        rule = {"pos": "> 0", "nonneg": ">= 0", "unit": "between 0 and 1"}[kind]
        raise ProfileError(f"{where}: must be {rule}, got {value!r}")
    return float(value)
