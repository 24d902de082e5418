"""The scheduling profile: data, validated when loaded.

A profile file (read outside the engine, see ``scheduler.profiles.files``) is a document in the
manner of kube-scheduler's ``KubeSchedulerConfiguration``: a header, then the profile::

    apiVersion: gantry.io/v1
    kind: SchedulingProfile
    name: default
    plugins: {score: {FragmentationScore: 2, GpuFit: 1, TopologyScore: 1}}
    order: {guaranteed_first: true, hold_for_higher_priority: true}
    fair_share: {half_life_s: 86400, history_weight: 0.5}
    aging: {per_hour: 10, max_boost: 1000}
    preemption: {min_runtime_s: 300, critical_overrides_min_runtime: true,
                 ping_pong_guard_s: 900, reclaim_any_priority: true, max_candidates: 256,
                 wait_for_cheaper_s: 30, within_tenant_gpu_ratio: 4}
    backfill: {enabled: true, unknown_runtime_s: 86400}
    placement: {max_scored_nodes: 128, fragmentation_step_milli: 100, cpu_only_share: 0.125}

``Profile.from_document`` checks the header and the rest; ``Profile.from_dict`` the profile
alone. Every key but the header is optional and defaults as in ``Profile``. Unknown keys,
unknown plugins and bad values are all reported at once, each by its key path and the value
given (``ProfileError.errors``), as kube-scheduler's strict decoding does.

``guaranteed_first`` orders jobs that fit in their tenant's guarantee before jobs that would
borrow, then by priority (as Kueue orders its queue heads): capacity freed by reclaiming a
guarantee goes to the reclaimer, not back to a higher-priority borrower.
``hold_for_higher_priority``: a job that waits for room (quota or devices), where it fits in its
tenant's guarantee, holds it against the jobs it could preempt there: a lower-priority job of
its tenant (within ``within_tenant_gpu_ratio``) or a borrower it would reclaim from is not
started in its stead, to be preempted once it fits (it waits, told so). Off: such a job starts
on whatever the waiting one cannot use yet, as Kueue's BestEffortFIFO admits, and may be
preempted for it soon after.
``max_scored_nodes`` bounds how many feasible nodes are scored per replica (as
kube-scheduler's percentageOfNodesToScore): the best-fitting ones, in node order.
``fragmentation_step_milli`` is how coarsely ``FragmentationScore`` compares the fragmentation
a placement adds (see ``scoring``). ``cpu_only_share`` is the most of a GPU node's CPU and
of its memory that jobs without GPUs may hold there, all together (``fit.cpu_only_room``):
the rest is kept for jobs with GPUs, so CPU-only jobs cannot strand its GPUs (1: no limit).
``wait_for_cheaper_s``: a preemptor waits up to this long for a cheaper victim about to leave
its minimum runtime rather than take a costlier one now (0: never waits).
``within_tenant_gpu_ratio``: inside its own tenant, a job preempts by priority only jobs
holding at most this many times the GPUs it asks for, unless its class is critical (0: no
bound), so a small inference job does not evict its team's large training job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCORE_PLUGINS = ("FragmentationScore", "GpuFit", "TopologyScore")
API_VERSION = "gantry.io/v1"
KIND = "SchedulingProfile"


class ProfileError(ValueError):
    """A profile that cannot be used. ``errors`` holds every problem found, each as (key
    path, message naming the value given); the message joins them."""

    def __init__(self, errors: Sequence[tuple[str, str]]) -> None:
        self.errors = tuple(errors)
        super().__init__("; ".join(f"{path}: {message}" for path, message in self.errors))


@dataclass(frozen=True, slots=True)
class Profile:
    name: str = "default"
    score_weights: Mapping[str, float] = field(
        default_factory=lambda: {"FragmentationScore": 2.0, "GpuFit": 1.0, "TopologyScore": 1.0}
    )
    guaranteed_first: bool = True
    hold_for_higher_priority: bool = True
    half_life_s: float = 86_400.0
    history_weight: float = 0.5
    aging_per_hour: float = 10.0
    aging_max_boost: float = 1_000.0
    min_runtime_s: float = 300.0
    critical_overrides_min_runtime: bool = True
    ping_pong_guard_s: float = 900.0
    reclaim_any_priority: bool = True
    max_preemption_candidates: int = 256
    wait_for_cheaper_s: float = 30.0
    within_tenant_gpu_ratio: float = 4.0
    backfill: bool = True
    unknown_runtime_s: float = 86_400.0
    max_scored_nodes: int = 128
    fragmentation_step_milli: float = 100.0
    cpu_only_share: float = 0.125

    @classmethod
    def from_document(cls, document: Any) -> Profile:
        """A whole profile file's content: the header (``apiVersion``, ``kind``) and the
        profile's keys beside it."""
        errors: list[tuple[str, str]] = []
        if not isinstance(document, Mapping):
            raise ProfileError([("(document)", f"expected a mapping, got {_shown(document)}")])
        for key, expected in (("apiVersion", API_VERSION), ("kind", KIND)):
            if key not in document:
                errors.append((key, f"missing; expected {expected!r}"))
            elif document[key] != expected:
                errors.append((key, f"expected {expected!r}, got {_shown(document[key])}"))
        body = {k: v for k, v in document.items() if k not in ("apiVersion", "kind")}
        try:
            profile = cls.from_dict(body)
        except ProfileError as error:
            errors.extend(error.errors)
        if errors:
            raise ProfileError(errors)
        return profile

    @classmethod
    def from_dict(cls, data: Any) -> Profile:
        errors: list[tuple[str, str]] = []
        values: dict[str, Any] = {}
        if not _only_keys(errors, "", data, ("name", "plugins", *_SECTIONS)):
            raise ProfileError(errors)
        if "name" in data:
            values["name"] = _text(errors, "name", data["name"])
        if "plugins" in data:
            values["score_weights"] = _score_weights(errors, data["plugins"])
        for section, spec in _SECTIONS.items():
            body = data.get(section, {})
            if not _only_keys(errors, section, body, tuple(spec)):
                continue
            for key, (attr, kind) in spec.items():
                if key in body:
                    values[attr] = _check(errors, f"{section}.{key}", body[key], kind)
        if errors:
            raise ProfileError(errors)
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, in ``from_dict``'s shape: ``from_dict(p.to_dict()) == p``."""
        out: dict[str, Any] = {
            "name": self.name,
            "plugins": {"score": dict(self.score_weights)},
        }
        for section, spec in _SECTIONS.items():
            out[section] = {key: getattr(self, attr) for key, (attr, _) in spec.items()}
        return out

    def to_document(self) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": KIND, **self.to_dict()}


# section -> key -> (Profile attribute, kind); kinds: "pos" > 0, "nonneg" >= 0,
# "unit" in [0, 1], "bool", "count" positive int.
_SECTIONS: dict[str, dict[str, tuple[str, str]]] = {
    "order": {
        "guaranteed_first": ("guaranteed_first", "bool"),
        "hold_for_higher_priority": ("hold_for_higher_priority", "bool"),
    },
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
        "wait_for_cheaper_s": ("wait_for_cheaper_s", "nonneg"),
        "within_tenant_gpu_ratio": ("within_tenant_gpu_ratio", "nonneg"),
    },
    "backfill": {
        "enabled": ("backfill", "bool"),
        "unknown_runtime_s": ("unknown_runtime_s", "pos"),
    },
    "placement": {
        "max_scored_nodes": ("max_scored_nodes", "count"),
        "fragmentation_step_milli": ("fragmentation_step_milli", "pos"),
        "cpu_only_share": ("cpu_only_share", "unit"),
    },
}
_RULES = {"pos": "> 0", "nonneg": ">= 0", "unit": "between 0 and 1"}

Errors = list[tuple[str, str]]


def _shown(value: Any) -> str:
    """The value as given, cut short: a message must name it, not repeat a whole file."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _score_weights(errors: Errors, plugins: Any) -> dict[str, float]:
    weights: dict[str, float] = {}
    if not _only_keys(errors, "plugins", plugins, ("score",)):
        return weights
    score = plugins.get("score", {})
    if not isinstance(score, Mapping):
        errors.append(
            ("plugins.score", f"expected a mapping of plugin name to weight, got {_shown(score)}")
        )
        return weights
    before = len(errors)
    for name, weight in score.items():
        if name not in SCORE_PLUGINS:
            known = ", ".join(SCORE_PLUGINS)
            errors.append((f"plugins.score.{name}", f"unknown plugin (known: {known})"))
            continue
        weights[name] = _check(errors, f"plugins.score.{name}", weight, "nonneg")
    if len(errors) == before and not any(weights.values()):
        errors.append(("plugins.score", "at least one plugin needs a positive weight"))
    return weights


def _only_keys(errors: Errors, where: str, body: Any, allowed: Sequence[str]) -> bool:
    """Whether ``body`` is a mapping; each key not in ``allowed`` is an error."""
    if not isinstance(body, Mapping):
        errors.append((where or "(document)", f"expected a mapping, got {_shown(body)}"))
        return False
    for key in body:
        if key not in allowed:
            path = f"{where}.{key}" if where else str(key)
            errors.append((path, f"unknown key (known: {', '.join(allowed)})"))
    return True


def _text(errors: Errors, where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        errors.append((where, f"expected a non-empty string, got {_shown(value)}"))
    return str(value)


def _check(errors: Errors, where: str, value: Any, kind: str) -> Any:
    if kind == "bool":
        if not isinstance(value, bool):
            errors.append((where, f"expected true or false, got {_shown(value)}"))
        return value
    if kind == "count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            errors.append((where, f"expected a positive integer, got {_shown(value)}"))
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        errors.append((where, f"expected a finite number, got {_shown(value)}"))
        return value
    bad = (
        (kind == "pos" and value <= 0)
        or (kind == "nonneg" and value < 0)
        or (kind == "unit" and not 0 <= value <= 1)
    )
    if bad:
        errors.append((where, f"must be {_RULES[kind]}, got {_shown(value)}"))
    return float(value)
