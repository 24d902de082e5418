"""Portal forms. They only shape browser input; the services validate and decide.

The job form turns its fields into the JSON spec `job_submit` takes and maps the spec
serializer's errors back onto its own fields, so every rule lives once, in `scheduler.jobs.spec`.
"""

from __future__ import annotations

import shlex
import uuid
from decimal import Decimal
from typing import Any

from django import forms
from rest_framework.exceptions import ErrorDetail

from scheduler.jobs.spec import MAX_RUNTIME_S
from scheduler.models import Cluster, JobState
from tenants.models import (
    ApprovalKind,
    ApprovalRule,
    ApprovalState,
    JobType,
    PriorityClass,
    ResourceFlavor,
    Role,
)

MILLI = Decimal(1000)

# Suggested values per job type, applied on the server for ?type= and by portal.js on change.
# Priority stays blank (the team's default for the type, shown next to the field) unless a
# type is conventionally urgent or patient.
TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    JobType.TRAINING: {
        "replicas": 1,
        "gpus": 8,
        "max_runtime_hours": "",
        "checkpointable": True,
        "retry_limit": 1,
    },
    JobType.FINE_TUNING: {
        "replicas": 1,
        "gpus": 2,
        "max_runtime_hours": 24,
        "checkpointable": True,
        "retry_limit": 1,
    },
    JobType.INFERENCE: {
        "replicas": 2,
        "min_replicas": 1,
        "max_replicas": 4,
        "gpus": 1,
        "max_runtime_hours": "",
        "checkpointable": False,
        "retry_limit": 3,
    },
    JobType.EVALUATION: {
        "replicas": 1,
        "gpus": 1,
        "max_runtime_hours": 24,
        "checkpointable": False,
        "retry_limit": 0,
    },
    JobType.BATCH: {
        "replicas": 4,
        "gpus": 1,
        "max_runtime_hours": 24,
        "checkpointable": False,
        "retry_limit": 2,
    },
    JobType.INTERACTIVE: {
        "replicas": 1,
        "gpus": 1,
        "max_runtime_hours": 8,
        "checkpointable": False,
        "retry_limit": 0,
    },
}
INFERENCE_ONLY = ("min_replicas", "max_replicas")

# Where a spec error lands on the form: top-level keys map by name, nested ones below.
NESTED_FIELDS = {
    "resources": {
        "gpus": "gpus",
        "gpu_milli": "gpu_milli",
        "gpu_memory_mib": "gpu_memory_mib",
        "mig_profile": "mig_profile",
        "cpu_milli": "cpu_milli",
        "memory_mib": "memory_mib",
    },
    "retry": {"limit": "retry_limit", "backoff_s": "retry_limit"},
}
RENAMED_FIELDS = {"max_runtime_s": "max_runtime_hours", "type": "job_type"}
# The spec's bounds are in seconds; the form asks for hours, so its messages say hours.
IN_FORM_UNITS = {
    "max_runtime_s": {"max_value": f"must be at most {Decimal(MAX_RUNTIME_S) / 3600:f} hours."}
}


class JobSubmitForm(forms.Form):
    project = forms.TypedChoiceField(coerce=int, choices=())
    job_type = forms.ChoiceField(label="Type", choices=JobType.choices, initial=JobType.TRAINING)
    name = forms.CharField(max_length=63, help_text="Lowercase letters, digits and '-'.")
    image = forms.CharField(max_length=512, initial="nvcr.io/nvidia/pytorch:24.05-py3")
    command = forms.CharField(
        max_length=8000,
        help_text="Split like a shell would, but never run by one: python train.py --lr 3e-4",
    )
    env = forms.CharField(
        label="Environment",
        required=False,
        max_length=16000,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "KEY=value, one per line"}),
    )
    replicas = forms.IntegerField(min_value=1, initial=1, help_text="All replicas start together.")
    min_replicas = forms.IntegerField(required=False, min_value=1)
    max_replicas = forms.IntegerField(required=False, min_value=1)
    # Blank when a GPU share or a MIG slice is asked instead (`clean`).
    gpus = forms.IntegerField(
        label="GPUs per replica",
        min_value=0,
        initial=1,
        required=False,
        help_text="Blank with a GPU share or MIG profile.",
    )
    gpu_milli = forms.IntegerField(
        label="GPU share (milli)", required=False, help_text="Instead of GPUs: 500 = half a GPU."
    )
    gpu_memory_mib = forms.IntegerField(label="GPU memory (MiB)", required=False)
    mig_profile = forms.CharField(label="MIG profile", required=False, max_length=32)
    cpu_milli = forms.IntegerField(label="CPU (millicores)", min_value=1, initial=4000)
    memory_mib = forms.IntegerField(label="Memory (MiB)", min_value=1, initial=32768)
    flavors = forms.MultipleChoiceField(
        label="GPU models",
        required=False,
        widget=forms.CheckboxSelectMultiple,
        help_text="None ticked: any model.",
    )
    priority_class = forms.ChoiceField(label="Priority", required=False)
    max_runtime_hours = forms.DecimalField(
        label="Max runtime (hours)",
        required=False,
        min_value=Decimal("0.02"),
        max_digits=6,
        decimal_places=2,
    )
    checkpointable = forms.BooleanField(required=False, initial=False)
    retry_limit = forms.IntegerField(label="Retries", min_value=0, initial=0)
    idempotency_key = forms.CharField(widget=forms.HiddenInput, max_length=128)

    def __init__(self, *args: Any, projects: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "project").choices = [
            (p.pk, f"{p.tenant.slug} / {p.slug}") for p in projects
        ]
        _choice_field(self, "flavors").choices = [
            (name, name) for name in ResourceFlavor.objects.values_list("name", flat=True)
        ]
        _choice_field(self, "priority_class").choices = [("", "Team default for the type")] + [
            (name, name) for name in PriorityClass.objects.values_list("name", flat=True)
        ]
        if not self.is_bound:
            self.initial.setdefault("idempotency_key", uuid.uuid4().hex)

    def apply_type_defaults(self, job_type: str) -> None:
        if job_type in TYPE_DEFAULTS:
            self.initial.update({"job_type": job_type, **TYPE_DEFAULTS[job_type]})

    def clean(self) -> dict[str, Any]:
        """Whole GPUs, or instead a share of one (gpu_milli, with its GPU memory) or a MIG
        slice: "GPUs per replica" is needed only when neither is given."""
        data = super().clean() or self.cleaned_data
        alternative = data.get("gpu_milli") is not None or data.get("mig_profile")
        if data.get("gpus") is None and not alternative and "gpus" not in self.errors:
            self.add_error(
                "gpus", "give the GPUs per replica (0 for none), or a GPU share or MIG profile."
            )
        return data

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["command"])
        except ValueError as exc:
            raise forms.ValidationError(f"cannot split the command: {exc}.") from None

    def clean_env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        lines: dict[str, int] = {}  # the line each variable was set on
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            key, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"line {number}: write KEY=value.")
            key = key.strip()
            if key in lines:  # which value was meant is the user's to say, not the last's
                raise forms.ValidationError(
                    f"line {number}: {key[:64]} is already set on line {lines[key]}; "
                    "set each variable once."
                )
            env[key], lines[key] = value, number
        return env

    def to_payload(self) -> dict[str, Any]:
        """The JSON spec for `job_submit`, leaving unset optional fields out. On a form with
        errors, the fields that failed are left out too (the spec then names what else is
        wrong, so that every error shows at once)."""
        data = self.cleaned_data
        payload: dict[str, Any] = {
            key: data[field]
            for key, field in (
                ("name", "name"),
                ("type", "job_type"),
                ("image", "image"),
                ("command", "command"),
                ("env", "env"),
                ("replicas", "replicas"),
                ("flavors", "flavors"),
                ("checkpointable", "checkpointable"),
            )
            if field in data
        }
        if "retry_limit" in data:
            payload["retry"] = {"limit": data["retry_limit"]}
        resources: dict[str, Any] = {
            key: data[key]
            for key in ("gpus", "cpu_milli", "memory_mib")
            if data.get(key) is not None
        }
        payload["resources"] = resources
        for key in ("gpu_milli", "gpu_memory_mib"):
            if data.get(key) is not None:
                resources[key] = data[key]
        if data.get("mig_profile"):
            resources["mig_profile"] = data["mig_profile"]
            resources["gpus"] = 0
        if data.get("gpu_milli") is not None:
            resources["gpus"] = 0
        if data.get("job_type") == JobType.INFERENCE:
            for key in INFERENCE_ONLY:
                if data.get(key) is not None:
                    payload[key] = data[key]
        if data.get("priority_class"):
            payload["priority_class"] = data["priority_class"]
        if data.get("max_runtime_hours") is not None:
            payload["max_runtime_s"] = int(data["max_runtime_hours"] * 3600)
        return payload

    def add_spec_errors(self, detail: Any) -> None:
        """Put the spec serializer's errors (a dict of lists or nested dicts) on fields."""
        if not isinstance(detail, dict):
            self.add_error(None, _flatten(detail))
            return
        for key, value in detail.items():
            if key in NESTED_FIELDS and isinstance(value, dict):
                for sub, sub_value in value.items():
                    self._add(NESTED_FIELDS[key].get(sub), sub_value, prefix=f"{sub}: ")
            else:
                value = _in_form_units(IN_FORM_UNITS.get(key, {}), value)
                self._add(RENAMED_FIELDS.get(key, key), value, prefix=f"{key}: ")

    def _add(self, field: str | None, value: Any, prefix: str) -> None:
        if field in self.fields:
            if field not in self.errors:  # the form's own message on it says enough
                self.add_error(field, _flatten(value))
        else:
            self.add_error(None, prefix + _flatten(value))


def _choice_field(form: forms.Form, name: str) -> forms.ChoiceField:
    field = form.fields[name]
    assert isinstance(field, forms.ChoiceField)
    return field


def _in_form_units(messages: dict[str, str], value: Any) -> Any:
    """`value` (a field's errors) with each message that `messages` words in the form's unit,
    by its code, replaced; the others as they are."""
    if not isinstance(value, list):
        return value
    return [
        messages.get(error.code or "", error) if isinstance(error, ErrorDetail) else error
        for error in value
    ]


def _flatten(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_flatten(v)}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return " ".join(_flatten(v) for v in value)
    return str(value)


class JobFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *JobState.choices])
    type = forms.ChoiceField(required=False, choices=[("", "Any type"), *JobType.choices])
    project = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, choices=())
    mine = forms.BooleanField(required=False, label="Only mine")

    def __init__(self, *args: Any, projects: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "project").choices = [("", "Any project")] + [
            (p.pk, f"{p.tenant.slug} / {p.slug}") for p in projects
        ]


class CancelForm(forms.Form):
    reason = forms.CharField(required=False, max_length=200)


class MembershipForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)


# The bounds of the quota API (10**12 milli-GPU, weights up to 10000): a larger number is a
# form error, not a database overflow.
MAX_QUOTA_GPUS = Decimal(10**9)


def _gpus_field(label: str, *, required: bool = True, help_text: str = "") -> forms.DecimalField:
    return forms.DecimalField(
        label=label,
        required=required,
        min_value=0,
        max_value=MAX_QUOTA_GPUS,
        max_digits=13,
        decimal_places=3,
        help_text=help_text,
    )


class QuotaForm(forms.Form):
    """Quota in GPUs (decimals allowed for shares); the service stores milli-GPU."""

    flavor = forms.ModelChoiceField(
        label="GPU model", queryset=ResourceFlavor.objects.all(), to_field_name="name"
    )
    cluster = forms.ModelChoiceField(
        label="Cluster",
        queryset=Cluster.objects.order_by("name"),
        to_field_name="name",
        required=False,
        empty_label="every cluster (global)",
        help_text="A quota pinned to a cluster holds on its nodes only, inside the global one: "
        "a guarantee and a limit.",
    )
    guaranteed = _gpus_field("Guaranteed (GPUs)")
    limit = _gpus_field("Limit (GPUs)")
    lend_limit = _gpus_field("Lend limit (GPUs)", required=False)
    user_limit = _gpus_field(
        "Per-user cap (GPUs)",
        required=False,
        help_text="The most one user of the tenant may hold of this model; blank: no cap.",
    )
    weight = forms.DecimalField(
        min_value=Decimal("0.001"),
        max_value=Decimal(10000),
        max_digits=8,
        decimal_places=3,
        initial=1,
    )
    justification = forms.CharField(
        required=False,
        max_length=1000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="For a request: why the team needs it.",
    )

    FIELD_OF_SERVICE_ERROR = {
        "guaranteed_milli": "guaranteed",
        "limit_milli": "limit",
        "lend_limit_milli": "lend_limit",
        "user_limit_milli": "user_limit",
        "weight": "weight",
        "cluster": "cluster",
    }

    def milli(self, name: str) -> int | None:
        value = self.cleaned_data.get(name)
        return None if value is None else int(value * MILLI)

    def add_service_errors(self, message_dict: dict[str, list[str]]) -> None:
        for key, messages in message_dict.items():
            field = self.FIELD_OF_SERVICE_ERROR.get(key)
            self.add_error(field, " ".join(messages))


class PriorityDefaultForm(forms.Form):
    job_type = forms.ChoiceField(choices=JobType.choices)
    priority_class = forms.ModelChoiceField(
        queryset=PriorityClass.objects.all(), to_field_name="name"
    )


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    comment = forms.CharField(
        required=False, max_length=1000, widget=forms.Textarea(attrs={"rows": 2})
    )


class HistoryFilterForm(forms.Form):
    state = forms.ChoiceField(required=False, choices=[("", "Any state"), *ApprovalState.choices])
    kind = forms.ChoiceField(
        required=False, choices=[("", "Jobs and quotas"), *ApprovalKind.choices]
    )


class PolicyForm(forms.Form):
    rule = forms.ChoiceField(choices=ApprovalRule.choices)
    threshold = forms.DecimalField(
        required=False,
        min_value=0,
        max_digits=12,
        decimal_places=3,
        help_text="GPUs, GPU-hours, hours or money, by rule; none for priority or borrowing.",
    )
    priority_class = forms.ModelChoiceField(
        queryset=PriorityClass.objects.all(),
        to_field_name="name",
        required=False,
        help_text="Only for 'priority at or above a class'.",
    )
    applies_to_jobs = forms.BooleanField(required=False, initial=True, label="Applies to jobs")
    applies_to_quota = forms.BooleanField(
        required=False, initial=False, label="Applies to quota requests"
    )
    description = forms.CharField(required=False, max_length=200)

    def add_service_errors(self, message_dict: dict[str, list[str]]) -> None:
        for key, messages in message_dict.items():
            self.add_error(key if key in self.fields else None, " ".join(messages))


class AuditFilterForm(forms.Form):
    action = forms.CharField(
        required=False,
        max_length=64,
        widget=forms.TextInput(attrs={"placeholder": "Action, e.g. quota"}),
    )
    actor = forms.CharField(
        required=False, max_length=150, widget=forms.TextInput(attrs={"placeholder": "User"})
    )
    tenant = forms.TypedChoiceField(required=False, coerce=int, empty_value=None, choices=())
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    page_size = forms.IntegerField(
        required=False, min_value=10, max_value=100, widget=forms.HiddenInput
    )

    def __init__(self, *args: Any, tenants: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _choice_field(self, "tenant").choices = [("", "Any tenant")] + [
            (t.pk, t.slug) for t in tenants
        ]


class IdleRuleForm(forms.Form):
    """A tenant's idle rule (tenants/idle_rules.py), in minutes as the API."""

    threshold_pct = forms.FloatField(
        min_value=0,
        max_value=100,
        label="Threshold (%)",
        help_text="Idle while every GPU of a job stays under this utilization.",
    )
    duration_minutes = forms.IntegerField(min_value=1, max_value=7 * 24 * 60, label="For (minutes)")
    action = forms.ChoiceField(
        choices=[
            ("notify", "Notify the owner and the admins"),
            ("notify_and_stop", "Notify, and stop interactive jobs"),
            ("nothing", "Nothing (count the idle time only)"),
        ]
    )


class AllowedRegistriesForm(forms.Form):
    """A tenant's allowed registries (tenants/registries.py), one per line."""

    entries = forms.CharField(
        required=False,
        max_length=8000,
        label="Allowed registries",
        widget=forms.Textarea(attrs={"rows": 6}),
        help_text="One registry host or host/path prefix a line (nvcr.io/nvidia, "
        "docker.io/pytorch). Empty: follow the list above.",
    )

    def clean_entries(self) -> list[str]:
        return [line.strip() for line in self.cleaned_data["entries"].splitlines() if line.strip()]


class WebhookForm(forms.Form):
    webhook_url = forms.CharField(
        required=False,
        max_length=500,
        label="Webhook URL",
        help_text='https only; receives {"text": ...} (Slack, Teams). Empty removes it.',
    )
