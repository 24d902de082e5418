"""Forms of the Nodes pages: the inventory's filters and the admin actions on one node."""

from __future__ import annotations

from typing import Any

from django import forms

from scheduler.nodes.selectors import HEALTH_CHOICES

ACTIONS = [
    ("cordon", "Cordon"),
    ("drain", "Drain"),
    ("uncordon", "Uncordon"),
    ("heal", "Heal"),
    # The simulated cluster only (portal/views/nodes.py refuses them elsewhere).
    ("fail", "Simulate failure"),
    ("recover", "Recover"),
]
SIMULATED_ONLY = {"fail", "recover"}


class NodeFilterForm(forms.Form):
    cluster = forms.ChoiceField(required=False)
    pool = forms.ChoiceField(required=False)
    model = forms.ChoiceField(required=False)
    health = forms.ChoiceField(required=False, choices=[("", "Any health"), *HEALTH_CHOICES])
    schedulable = forms.ChoiceField(
        required=False,
        choices=[("", "Schedulable or not"), ("yes", "Schedulable"), ("no", "Cordoned")],
    )

    def __init__(
        self,
        *args: Any,
        pools: list[str],
        models: list[str],
        clusters: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        pool, model = self.fields["pool"], self.fields["model"]
        cluster = self.fields["cluster"]
        assert isinstance(pool, forms.ChoiceField) and isinstance(model, forms.ChoiceField)
        assert isinstance(cluster, forms.ChoiceField)
        pool.choices = [("", "Any pool"), *((p, p) for p in pools)]
        model.choices = [("", "Any GPU model"), *((m, m) for m in models)]
        cluster.choices = [("", "Any cluster"), *((c, c) for c in clusters or ())]


class NodeActionForm(forms.Form):
    action = forms.ChoiceField(choices=ACTIONS)
    reason = forms.CharField(required=False, max_length=300)
    # Drain stops every job on the node: the first POST shows what it would stop, the
    # second (with `confirm`) does it.
    confirm = forms.BooleanField(required=False)
