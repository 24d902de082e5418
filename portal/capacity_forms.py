"""The capacity page's forms of planning inputs. They only read the page's text into the API's
bodies (JSON's types: whole numbers as integers, money and shares as decimal strings); the
checks are the API's (capacity/api/submissions.py), and its errors come back onto the fields
they name. A bad value is the page again, with what was typed and the error beside the field
under its label."""

from __future__ import annotations

from typing import Any, ClassVar

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from rest_framework import serializers
from rest_framework.fields import empty

from capacity.api import serializers as s
from tenants.models import ResourceFlavor


def _flavor(**kwargs: Any) -> forms.ModelChoiceField:
    return forms.ModelChoiceField(
        label="Model",
        queryset=ResourceFlavor.objects.order_by("name"),
        empty_label=None,
        **kwargs,
    )


def _decimal(label: str, **kwargs: Any) -> forms.CharField:
    """Money or a share: text, as the API takes it ("2.50")."""
    widget = forms.TextInput(attrs={"inputmode": "decimal"})
    return forms.CharField(label=label, required=False, max_length=32, widget=widget, **kwargs)


def _whole(serializer: type[serializers.Serializer], name: str, label: str) -> forms.IntegerField:
    """A whole number, read from its text (the API takes a JSON integer); the API's bounds,
    which the API checks, as the browser's hints, and its default as the initial value."""
    api = serializer().fields[name]
    assert isinstance(api, serializers.IntegerField)
    bounds = {"min": api.min_value, "max": api.max_value}
    widget = forms.NumberInput(attrs={k: v for k, v in bounds.items() if v is not None})
    initial = None if api.default is empty else api.default
    return forms.IntegerField(label=label, required=False, widget=widget, initial=initial)


class PlanningForm(forms.Form):
    """One form of the page. Fields left empty are left out of the body: the API says which
    it needs."""

    # The form's name on the page: its element ids and its context variable ("<key>_form").
    key: ClassVar[str]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("auto_id", f"{self.key}-%s")  # several forms ask for a model
        super().__init__(*args, **kwargs)

    def api_data(self) -> dict[str, Any]:
        """The cleaned form as the API's body (a model as the API names it: its pk or name,
        what the field's `prepare_value` writes into the page)."""
        return {
            name: self.fields[name].prepare_value(value)
            for name, value in self.cleaned_data.items()
            if value not in (None, "")
        }

    def add_api_errors(self, error: ValidationError) -> None:
        """The API's errors onto the fields they name; the rest above the form."""
        if hasattr(error, "error_dict"):
            by_field = error.message_dict
        else:
            by_field = {NON_FIELD_ERRORS: error.messages}
        for key, texts in by_field.items():
            text = " ".join(texts)
            if key in self.fields:
                self.add_error(key, text)
            else:
                self.add_error(None, text if key == NON_FIELD_ERRORS else f"{key}: {text}")


class TcoForm(PlanningForm):
    key = "tco"
    flavor = _flavor()
    purchase_price = _decimal("Purchase price")
    depreciation_months = _whole(s.TcoInputsIn, "depreciation_months", "Depreciation months")
    power_cooling_per_gpu_hour = _decimal("Power and cooling per GPU-hour")
    hosting_support_per_month = _decimal("Hosting and support per month")
    on_demand_per_gpu_hour = _decimal("On demand per GPU-hour")
    committed_per_gpu_hour = _decimal("Committed per GPU-hour")


class ExpansionForm(PlanningForm):
    key = "expansion"
    action = forms.ChoiceField(
        label="Change", choices=[("add", "add"), ("remove", "remove"), ("move", "move")]
    )
    gpus = _whole(s.ExpansionIn, "gpus", "GPUs")
    flavor = _flavor(to_field_name="name")  # the API takes the model's name here
    from_pool = forms.CharField(label="From pool (a move)", required=False, max_length=63)
    to_pool = forms.CharField(label="To pool (a move)", required=False, max_length=63)
    window_days = _whole(s.ExpansionIn, "window_days", "Days of jobs replayed")
    at_day = _whole(s.ExpansionIn, "at_day", "Demand of the day ahead")


class PoolTargetForm(PlanningForm):
    key = "target"
    flavor = _flavor()
    target_utilization = _decimal("Full at utilization", initial="0.8")


class RateSuggestionForm(PlanningForm):
    key = "suggest"
    flavor = _flavor()
    target_utilization = _decimal("Target utilization", initial="0.8")
