"""The portal's form for a new rate card version. It only shapes browser input: the fields
go, as text, through the API's own serializer (`billing.api.serializers.RateCardIn`) and then
`billing.rates.cards.rate_card_add`, so every rule lives once; their errors come back onto
the form's fields."""

from __future__ import annotations

from typing import Any

from django import forms

from scheduler.models import Cluster
from tenants.models import PriorityClass, ResourceFlavor

PRICE_HELP = 'A decimal, such as "2.50".'


class RateCardForm(forms.Form):
    flavor = forms.ModelChoiceField(
        label="GPU model", queryset=ResourceFlavor.objects.order_by("name"), to_field_name="name"
    )
    cluster = forms.ModelChoiceField(
        label="Cluster",
        queryset=Cluster.objects.order_by("name"),
        to_field_name="name",
        required=False,
        empty_label="default (every cluster without a card of its own)",
    )
    valid_from = forms.CharField(
        label="Effective from (UTC)",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": 3600}),
        help_text="On the hour, not before the time already metered.",
    )
    valid_to = forms.CharField(
        label="Until (UTC)",
        required=False,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": 3600}),
        help_text="Blank: open-ended.",
    )
    gpu_hour = forms.CharField(label="Per GPU-hour", max_length=32, help_text=PRICE_HELP)
    cpu_core_hour = forms.CharField(label="Per CPU core-hour", max_length=32, initial="0")
    memory_gib_hour = forms.CharField(label="Per memory GiB-hour", max_length=32, initial="0")
    borrowed_discount = forms.CharField(
        label="Borrowed discount",
        max_length=32,
        initial="0",
        help_text="Fraction off capacity borrowed beyond the guarantee (0.3 = 30 % off).",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.classes = list(PriorityClass.objects.order_by("-value").values_list("name", flat=True))
        for name in self.classes:
            self.fields[f"multiplier_{name}"] = forms.CharField(
                label=f"Multiplier, {name}",
                max_length=32,
                required=False,
                help_text="Blank: x1.",
            )

    def api_data(self) -> dict[str, Any]:
        """The cleaned form as the API's input (`RateCardIn`)."""
        data = self.cleaned_data
        multipliers = {
            name: data[f"multiplier_{name}"] for name in self.classes if data[f"multiplier_{name}"]
        }
        return {
            "flavor": data["flavor"].pk,
            "cluster": data["cluster"].name if data["cluster"] else None,
            "valid_from": data["valid_from"],
            "valid_to": data["valid_to"] or None,
            "gpu_hour": data["gpu_hour"],
            "cpu_core_hour": data["cpu_core_hour"],
            "memory_gib_hour": data["memory_gib_hour"],
            "borrowed_discount": data["borrowed_discount"],
            "priority_multipliers": multipliers,
        }

    def add_errors(self, errors: dict[str, Any]) -> None:
        """The serializer's or the service's errors onto the fields they name (the rest on the
        form as a whole)."""
        for key, messages in errors.items():
            text = " ".join(_flat(messages))
            if key == "priority_multipliers" and isinstance(messages, dict):
                for name, inner in messages.items():
                    field = f"multiplier_{name}"
                    self.add_error(field if field in self.fields else None, " ".join(_flat(inner)))
                continue
            self.add_error(key if key in self.fields else None, text)


def _flat(messages: Any) -> list[str]:
    if isinstance(messages, dict):
        return [m for inner in messages.values() for m in _flat(inner)]
    if isinstance(messages, list | tuple):
        return [m for inner in messages for m in _flat(inner)]
    return [str(messages)]
