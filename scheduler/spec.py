"""The job spec: what a user may ask for, validated field by field with clear messages.

Used by the API, the portal form and the CLI alike (through `job_submit`). Unknown fields are
errors, and fields only the system sets (state, approvals, owner, tenant) are refused by name,
so a typo or a privilege grab never passes silently. Commands are argument lists, never shell
strings: nothing here is ever given to a shell.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from rest_framework import serializers

from common.text import DNS_LABEL
from scheduler.backends.base import RESERVED_ENV
from tenants.models import JobType, PriorityClass, ResourceFlavor

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
    """Refuse keys the serializer does not declare, naming them."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(f"must be an object, got {type(data).__name__}.")
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError(
                {key[:64]: ["unknown field."] for key in unknown[:20]}
            )
        return super().to_internal_value(data)


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

    def to_internal_value(self, data: Any) -> Any:
        gpus = data.get("gpus") if isinstance(data, dict) else None
        if isinstance(gpus, float) and not gpus.is_integer():
            raise serializers.ValidationError(
                {
                    "gpus": [
                        f"must be a whole number of GPUs, got {gpus!r}; for a share of one "
                        "GPU use gpu_milli (e.g. 500 for half a GPU) with gpu_memory_mib."
                    ]
                }
            )
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        share, whole, mig = attrs.get("gpu_milli"), attrs.get("gpus", 0), attrs.get("mig_profile")
        if share is not None and whole:
            raise serializers.ValidationError(
                {
                    "gpu_milli": [
                        "ask for whole GPUs (gpus) or a share of one (gpu_milli), not both."
                    ]
                }
            )
        if share is not None and attrs.get("gpu_memory_mib") is None:
            raise serializers.ValidationError(
                {
                    "gpu_memory_mib": [
                        "a GPU share (gpu_milli) needs the GPU memory it uses, in MiB."
                    ]
                }
            )
        if mig is not None and (share is not None or whole):
            raise serializers.ValidationError(
                {"mig_profile": ["a MIG slice replaces gpus and gpu_milli; set only mig_profile."]}
            )
        return attrs


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
    priority_class = StrictCharField(required=False, allow_null=True, default=None, max_length=63)
    max_runtime_s = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=60, max_value=MAX_RUNTIME_S
    )
    estimated_runtime_s = StrictIntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=MAX_RUNTIME_S
    )
    checkpointable = StrictBooleanField(required=False, default=False)
    retry = RetrySerializer(required=False)
    simulation = SimulationSerializer(required=False)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            privileged = sorted(PRIVILEGED_FIELDS & set(data))
            if privileged:
                raise serializers.ValidationError(
                    {key: ["is set by Gantry, not by the submitter."] for key in privileged}
                )
            if isinstance(data.get("command"), str):
                raise serializers.ValidationError(
                    {
                        "command": [
                            "must be a list of arguments, not a shell string, e.g. "
                            '["python", "train.py"]; Gantry never runs commands through a shell.'
                        ]
                    }
                )
        return super().to_internal_value(data)

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
        return value

    def validate_flavors(self, value: list[str]) -> list[str]:
        known = set(ResourceFlavor.objects.values_list("name", flat=True))
        unknown = [name for name in value if name not in known]
        if unknown:
            raise serializers.ValidationError(
                f"unknown flavor {unknown[0][:64]!r}; "
                f"known flavors: {', '.join(sorted(known)) or 'none'}."
            )
        return list(dict.fromkeys(value))

    def validate_priority_class(self, value: str | None) -> str | None:
        if value is not None and not PriorityClass.objects.filter(name=value).exists():
            names = ", ".join(PriorityClass.objects.values_list("name", flat=True))
            raise serializers.ValidationError(
                f"unknown priority class {value[:64]!r}; known classes: {names or 'none'}."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs.setdefault("resources", ResourcesSerializer().to_internal_value({}))
        attrs.setdefault("retry", RetrySerializer().to_internal_value({}))
        attrs.setdefault("simulation", SimulationSerializer().to_internal_value({}))
        self._validate_replicas(attrs)
        self._validate_mig(attrs)
        if attrs["max_runtime_s"] is None:
            attrs["max_runtime_s"] = DEFAULT_MAX_RUNTIME_S.get(attrs["type"])
        return attrs

    def _validate_replicas(self, attrs: dict[str, Any]) -> None:
        low, high = attrs.get("min_replicas"), attrs.get("max_replicas")
        if attrs["type"] != JobType.INFERENCE:
            if low is not None or high is not None:
                raise serializers.ValidationError(
                    {
                        "min_replicas": [
                            "min_replicas and max_replicas apply to inference jobs only."
                        ]
                    }
                )
            return
        low = attrs["min_replicas"] = low if low is not None else attrs["replicas"]
        high = attrs["max_replicas"] = high if high is not None else max(low, attrs["replicas"])
        if low > high:
            raise serializers.ValidationError(
                {"max_replicas": [f"max_replicas ({high}) is below min_replicas ({low})."]}
            )
        if not low <= attrs["replicas"] <= high:
            raise serializers.ValidationError(
                {
                    "replicas": [
                        f"replicas ({attrs['replicas']}) must lie between min_replicas "
                        f"({low}) and max_replicas ({high})."
                    ]
                }
            )

    def _validate_mig(self, attrs: dict[str, Any]) -> None:
        profile = attrs["resources"].get("mig_profile")
        if profile is None:
            return
        flavors = ResourceFlavor.objects.all()
        if attrs["flavors"]:
            flavors = flavors.filter(name__in=attrs["flavors"])
        offered = sorted({p for f in flavors for p in (f.mig_profiles or [])})
        if profile not in offered:
            raise serializers.ValidationError(
                {
                    "resources": {
                        "mig_profile": [
                            f"unknown MIG profile {profile[:32]!r}; the allowed flavors offer: "
                            f"{', '.join(offered) or 'none'}."
                        ]
                    }
                }
            )
