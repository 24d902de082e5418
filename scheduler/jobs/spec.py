"""The job spec: what a user may ask for, validated field by field with clear messages.

Used by the API, the portal form and the CLI alike (through `job_submit`). Unknown fields are
errors, and fields only the system sets (state, approvals, owner, tenant) are refused by name,
so a typo or a privilege grab never passes silently. Commands are argument lists, never shell
strings: nothing here is ever given to a shell.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.fields import SkipField, get_error_detail

from common.text import DNS_LABEL, label_errors
from scheduler.backends.base import RESERVED_ENV
from scheduler.clusters.selectors import cluster_labels
from scheduler.core.clusters import NO_CLUSTER, resolve_placement
from scheduler.models import Cluster, Node
from tenants.models import JobType, PriorityClass, ResourceFlavor
from tenants.selectors import flavor_names, priority_class_named

IMAGE_RE = re.compile(
    r"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*"
    r"(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*(?::[\w][\w.-]{0,127})?(?:@sha256:[a-f0-9]{64})?\Z"
)
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}\Z")
PRIVILEGED_FIELDS = frozenset(
    {
        "state",
        "approved_by",
        "approval",
        "submitted_by",
        "owner",
        "tenant",
        "attempt",
        "node",
        "node_name",
        "nodeName",
        "scheduler_name",
        "schedulerName",
        "allocation",
        "privileged",
        "host_network",
        "hostNetwork",
        "service_account",
        "serviceAccountName",
        "tolerations",
        "security_context",
        "securityContext",
        "volumes",
        "host_path",
    }
)
MAX_RUNTIME_S = 30 * 24 * 3600
# A declared maximum runtime shorter than this is refused: a cycle or two would end it.
MIN_MAX_RUNTIME_S = 60
DEFAULT_MAX_RUNTIME_S = {
    JobType.INTERACTIVE: 8 * 3600,
    JobType.EVALUATION: 24 * 3600,
    JobType.BATCH: 24 * 3600,
}


def _no_control(value: str, what: str) -> None:
    for ch in value:
        if unicodedata.category(ch) in {"Cc", "Cf"} and ch not in "\t\n":
            raise serializers.ValidationError(
                f"{what} contains the control character U+{ord(ch):04X}."
            )


class StrictIntegerField(serializers.IntegerField):
    """An integer that is an integer: not a bool, not 1.5, not "2"."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, float) and data.is_integer():
            data = int(data)
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError(f"must be a whole number, got {data!r}."[:200])
        return int(super().to_internal_value(data))


class StrictCharField(serializers.CharField):
    """Text that is text: 123 or true is a wrong type, not the string "123"."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            kind = {
                bool: "a boolean",
                int: "a number",
                float: "a number",
                list: "an array",
                dict: "an object",
            }.get(type(data), type(data).__name__)
            raise serializers.ValidationError(f"must be a string, got {kind}.")
        return str(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError(f"must be true or false, got {data!r}."[:200])
        return data


class StrictDictSerializer(serializers.Serializer):
    """Refuse keys the serializer does not declare, naming them; report every error at once.

    DRF stops at the first failing stage (a key refused up front hides the fields' errors,
    and checks across fields run only when every field passed). Here unknown keys,
    ``refused`` keys, each field's own errors and the ``cross_checks`` of the fields that
    passed are gathered into one error, so a form or a client sees all its mistakes in one
    round."""

    def refused(self, data: dict[str, Any]) -> dict[str, Any]:
        """Errors for keys refused before their field is read (none by default)."""
        return {}

    def cross_checks(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Errors of rules across fields, on the fields that passed (``attrs`` may lack
        any field that failed: a rule whose inputs are missing is skipped)."""
        return {}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(f"must be an object, got {type(data).__name__}.")
        unknown = sorted(set(data) - set(self.fields))
        errors: dict[str, Any] = {key[:64]: ["unknown field."] for key in unknown[:20]}
        errors.update(self.refused(data))
        attrs, field_errors = self._fields(data, skip=set(errors))
        errors.update(field_errors)
        for key, value in self.cross_checks(attrs).items():
            errors.setdefault(key, value)
        if errors:
            raise serializers.ValidationError(errors)
        return attrs

    def _fields(
        self, data: dict[str, Any], skip: set[str]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Each declared field but ``skip`` validated on its own (DRF's loop, not stopping)."""
        attrs: dict[str, Any] = {}
        errors: dict[str, Any] = {}
        for field in self._writable_fields:
            name = str(field.field_name)
            if name in skip:
                continue
            check = getattr(self, f"validate_{name}", None)
            try:
                value = field.run_validation(field.get_value(data))
                if check is not None:
                    value = check(value)
            except serializers.ValidationError as exc:
                errors[name] = exc.detail
            except DjangoValidationError as exc:
                errors[name] = get_error_detail(exc)
            except SkipField:
                pass
            else:
                self.set_value(attrs, field.source_attrs, value)
        return attrs, errors


class ResourcesSerializer(StrictDictSerializer):
    gpus = StrictIntegerField(
        required=False,
        default=0,
        min_value=0,
        max_value=64,
        help_text="Whole GPUs per replica, all on one node.",
    )
    gpu_milli = StrictIntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=1,
        max_value=999,
        help_text="A share of one GPU in milli-GPU (500 = half a GPU).",
    )
    gpu_memory_mib = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=1 << 20
    )
    mig_profile = StrictCharField(required=False, allow_null=True, default=None, max_length=32)
    cpu_milli = StrictIntegerField(required=False, default=1000, min_value=1, max_value=1_024_000)
    memory_mib = StrictIntegerField(required=False, default=4096, min_value=1, max_value=16 << 20)
    rdma = StrictIntegerField(required=False, default=0, min_value=0, max_value=16)

    def refused(self, data: dict[str, Any]) -> dict[str, Any]:
        gpus = data.get("gpus")
        if isinstance(gpus, float) and not gpus.is_integer():
            return {
                "gpus": [
                    f"must be a whole number of GPUs, got {gpus!r}; for a share of one "
                    "GPU use gpu_milli (e.g. 500 for half a GPU) with gpu_memory_mib."
                ]
            }
        return {}

    def cross_checks(self, attrs: dict[str, Any]) -> dict[str, Any]:
        share, whole, mig = attrs.get("gpu_milli"), attrs.get("gpus", 0), attrs.get("mig_profile")
        errors: dict[str, Any] = {}
        if share is not None and whole:
            errors["gpu_milli"] = [
                "ask for whole GPUs (gpus) or a share of one (gpu_milli), not both."
            ]
        if share is not None and "gpu_memory_mib" in attrs and attrs["gpu_memory_mib"] is None:
            errors["gpu_memory_mib"] = [
                "a GPU share (gpu_milli) needs the GPU memory it uses, in MiB."
            ]
        if mig is not None and (share is not None or whole):
            errors["mig_profile"] = [
                "a MIG slice replaces gpus and gpu_milli; set only mig_profile."
            ]
        return errors


class RetrySerializer(StrictDictSerializer):
    limit = StrictIntegerField(required=False, default=0, min_value=0, max_value=20)
    backoff_s = StrictIntegerField(required=False, default=30, min_value=0, max_value=6 * 3600)


class SimulationSerializer(StrictDictSerializer):
    """How the simulated cluster runs the job (ignored by the Kubernetes backend)."""

    duration_s = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_RUNTIME_S
    )
    # DRF moves declared fields off the class, so this does not shadow Field.fail().
    fail = StrictBooleanField(required=False, default=False)  # type: ignore[assignment]


def _names(max_length: int = 16) -> serializers.ListField:
    return serializers.ListField(
        child=StrictCharField(max_length=63), required=False, default=list, max_length=max_length
    )


def _labels() -> serializers.DictField:
    return serializers.DictField(
        child=StrictCharField(max_length=63, allow_blank=True), required=False, default=dict
    )


class PlacementSerializer(StrictDictSerializer):
    """Where the job may run when Gantry drives several clusters (docs/multicluster.md): in one
    of `clusters` and of `regions` (any when empty), in a cluster carrying every label of
    `cluster_labels`; in one of `preferred_clusters`, else one carrying
    `preferred_cluster_labels` (data locality: the labels of the clusters that hold its data),
    when it fits there. Whatever is asked, a job runs in exactly one cluster."""

    clusters = _names()
    regions = _names()
    cluster_labels = _labels()
    preferred_clusters = _names()
    preferred_cluster_labels = _labels()

    def _known(self, value: list[str]) -> list[str]:
        known = set(Cluster.objects.values_list("name", flat=True))
        unknown = [name for name in value if name not in known]
        if unknown:
            raise serializers.ValidationError(
                f"unknown cluster {unknown[0][:64]!r}; known clusters: {', '.join(sorted(known))}."
            )
        return value

    def validate_clusters(self, value: list[str]) -> list[str]:
        return self._known(value)

    def validate_preferred_clusters(self, value: list[str]) -> list[str]:
        return self._known(value)

    def validate_regions(self, value: list[str]) -> list[str]:
        bad = [region for region in value if not DNS_LABEL.match(region)]
        if bad:
            raise serializers.ValidationError(f"{bad[0][:64]!r} is not a valid region name.")
        return value

    def validate_cluster_labels(self, value: dict[str, str]) -> dict[str, str]:
        if errors := label_errors(value, limit=16):
            raise serializers.ValidationError(errors)
        return value

    def validate_preferred_cluster_labels(self, value: dict[str, str]) -> dict[str, str]:
        return self.validate_cluster_labels(value)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Labels a job requires must name some cluster (within the clusters it names)."""
        selector = attrs.get("cluster_labels") or {}
        if selector:
            labels = cluster_labels()
            required, _ = resolve_placement(attrs, labels)
            if NO_CLUSTER in required:
                asked = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
                within = f" among {', '.join(attrs['clusters'])}" if attrs.get("clusters") else ""
                raise serializers.ValidationError(
                    {
                        "cluster_labels": [
                            f"no cluster{within} carries {asked}; clusters' labels: "
                            + "; ".join(f"{name} {_shown(labels[name])}" for name in sorted(labels))
                            + "."
                        ]
                    }
                )
        return attrs


def _known_pools() -> set[str] | None:
    """The pools a job may name, or None when pools are not judged.

    Nodes come and go, so "known" is every pool a node Gantry has recorded carries (its
    `gantry.io/pool` label), present now or not: the cluster's leaving nodes keep their rows
    (`present=False`), so a pool whose nodes are drained, rebooting or scaled to zero stays
    known and a job for it waits for them, while a name no node ever carried (a typo) would
    wait forever. Not judged, as `scheduler.jobs.feasibility` does not judge the inventory:
    before any node is recorded (the cluster not listed yet), and where nodes may be added
    (`GANTRY_REFUSE_BEYOND_INVENTORY` off: an autoscaler may bring a pool no node had)."""
    if not settings.GANTRY_REFUSE_BEYOND_INVENTORY:
        return None
    return set(Node.objects.values_list("pool", flat=True).distinct()) or None


def _shown(labels: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"


class JobSpecSerializer(StrictDictSerializer):
    name = StrictCharField(max_length=63)
    type = serializers.ChoiceField(choices=JobType.choices)
    image = StrictCharField(max_length=512)
    command = serializers.ListField(
        child=StrictCharField(max_length=4096, allow_blank=True, trim_whitespace=False),
        min_length=1,
        max_length=128,
    )
    env = serializers.DictField(
        child=StrictCharField(max_length=8192, allow_blank=True, trim_whitespace=False),
        required=False,
        default=dict,
    )
    replicas = StrictIntegerField(required=False, default=1, min_value=1, max_value=1024)
    min_replicas = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=1024
    )
    max_replicas = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=1024
    )
    resources = ResourcesSerializer(required=False)
    flavors = serializers.ListField(
        child=StrictCharField(max_length=63), required=False, default=list, max_length=16
    )
    pools = serializers.ListField(
        child=StrictCharField(max_length=63), required=False, default=list, max_length=16
    )
    placement = PlacementSerializer(required=False)
    priority_class = StrictCharField(required=False, allow_null=True, default=None, max_length=63)
    max_runtime_s = StrictIntegerField(
        required=False,
        allow_null=True,
        default=None,
        min_value=MIN_MAX_RUNTIME_S,
        max_value=MAX_RUNTIME_S,
    )
    estimated_runtime_s = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_RUNTIME_S
    )
    checkpointable = StrictBooleanField(required=False, default=False)
    retry = RetrySerializer(required=False)
    simulation = SimulationSerializer(required=False)

    def refused(self, data: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, Any] = {
            key: ["is set by Gantry, not by the submitter."]
            for key in sorted(PRIVILEGED_FIELDS & set(data))
        }
        if isinstance(data.get("command"), str):
            errors["command"] = [
                "must be a list of arguments, not a shell string, e.g. "
                '["python", "train.py"]; Gantry never runs commands through a shell.'
            ]
        return errors

    def cross_checks(self, attrs: dict[str, Any]) -> dict[str, Any]:
        errors: dict[str, Any] = {}
        if "type" in attrs and "replicas" in attrs:
            errors.update(self._replica_errors(attrs))
        if "resources" in attrs and "flavors" in attrs:
            errors.update(self._mig_errors(attrs))
        return errors

    def validate_name(self, value: str) -> str:
        if not DNS_LABEL.match(value):
            raise serializers.ValidationError(
                f"{value[:70]!r} is not a valid job name: use 1-63 lowercase letters, digits "
                "or '-', starting and ending with a letter or digit."
            )
        return value

    def validate_image(self, value: str) -> str:
        if not IMAGE_RE.match(value):
            raise serializers.ValidationError(
                f"{value[:80]!r} is not a container image reference "
                "(e.g. registry.example.com/team/train:1.2 or pytorch/pytorch:2.4)."
            )
        return value

    def validate_command(self, value: list[str]) -> list[str]:
        for index, arg in enumerate(value):
            _no_control(arg, f"argument {index}")
        if not value[0]:
            raise serializers.ValidationError("the first argument (the program) is empty.")
        return value

    def validate_env(self, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 128:
            raise serializers.ValidationError(f"at most 128 variables, got {len(value)}.")
        for key, item in value.items():
            if not ENV_KEY_RE.match(key):
                raise serializers.ValidationError(
                    f"{key[:64]!r} is not a valid variable name (letters, digits, '_')."
                )
            if RESERVED_ENV.match(key):
                raise serializers.ValidationError(
                    f"{key} is reserved: Gantry or the GPU runtime sets it, a job cannot."
                )
            _no_control(item, f"the value of {key}")
        return value

    def validate_pools(self, value: list[str]) -> list[str]:
        bad = [pool for pool in value if not DNS_LABEL.match(pool)]
        if bad:
            raise serializers.ValidationError(f"{bad[0][:64]!r} is not a valid pool name.")
        known = _known_pools() if value else None
        if known is None:
            return value
        unknown = list(dict.fromkeys(pool for pool in value if pool not in known))
        if unknown:
            raise serializers.ValidationError(
                f"unknown pool{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(pool) for pool in unknown)}; known pools (those of the "
                f"nodes Gantry has seen, present now or not): {', '.join(sorted(known))}."
            )
        return value

    def validate_flavors(self, value: list[str]) -> list[str]:
        if not value:
            return []
        known = set(flavor_names())
        unknown = [name for name in value if name not in known]
        if unknown:
            raise serializers.ValidationError(
                f"unknown flavor {unknown[0][:64]!r}; "
                f"known flavors: {', '.join(sorted(known)) or 'none'}."
            )
        return list(dict.fromkeys(value))

    def validate_priority_class(self, value: str | None) -> str | None:
        if value is not None and priority_class_named(value) is None:
            names = ", ".join(PriorityClass.objects.values_list("name", flat=True))
            raise serializers.ValidationError(
                f"unknown priority class {value[:64]!r}; known classes: {names or 'none'}."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("resources", ResourcesSerializer().to_internal_value({}))
        attrs.setdefault("retry", RetrySerializer().to_internal_value({}))
        attrs.setdefault("simulation", SimulationSerializer().to_internal_value({}))
        if attrs["type"] == JobType.INFERENCE:
            low = attrs["min_replicas"] = attrs.get("min_replicas") or attrs["replicas"]
            attrs["max_replicas"] = attrs.get("max_replicas") or max(low, attrs["replicas"])
        if attrs["max_runtime_s"] is None:
            attrs["max_runtime_s"] = DEFAULT_MAX_RUNTIME_S.get(attrs["type"])
        return attrs

    def _replica_errors(self, attrs: dict[str, Any]) -> dict[str, Any]:
        low, high = attrs.get("min_replicas"), attrs.get("max_replicas")
        if attrs["type"] != JobType.INFERENCE:
            if low is not None or high is not None:
                return {
                    "min_replicas": ["min_replicas and max_replicas apply to inference jobs only."]
                }
            return {}
        replicas = attrs["replicas"]
        low = low if low is not None else replicas
        high = high if high is not None else max(low, replicas)
        if low > high:
            return {"max_replicas": [f"max_replicas ({high}) is below min_replicas ({low})."]}
        if not low <= replicas <= high:
            return {
                "replicas": [
                    f"replicas ({replicas}) must lie between min_replicas "
                    f"({low}) and max_replicas ({high})."
                ]
            }
        return {}

    def _mig_errors(self, attrs: dict[str, Any]) -> dict[str, Any]:
        profile = attrs["resources"].get("mig_profile")
        if profile is None:
            return {}
        flavors = ResourceFlavor.objects.all()
        if attrs["flavors"]:
            flavors = flavors.filter(name__in=attrs["flavors"])
        offered = sorted({p for f in flavors for p in (f.mig_profiles or [])})
        if profile in offered:
            return {}
        return {
            "resources": {
                "mig_profile": [
                    f"unknown MIG profile {profile[:32]!r}; the allowed flavors offer: "
                    f"{', '.join(offered) or 'none'}."
                ]
            }
        }


def spec_errors(payload: dict[str, Any]) -> dict[str, Any]:
    """Every error of ``payload`` by field, {} when it is a valid spec; for a form that shows
    the spec's errors beside its own before anything is submitted."""
    serializer = JobSpecSerializer(data=payload)
    return {} if serializer.is_valid() else dict(serializer.errors)
