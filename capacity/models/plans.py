"""What the platform and finance enter to plan with: each pool's target utilization, the cost
of owning and of renting a GPU model (TCO), and rate cards suggested from it. All changed
through capacity/services.py, audited."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from billing.models import RateCard
from tenants.models import ResourceFlavor


def money(**kwargs: object) -> models.DecimalField:
    return models.DecimalField(max_digits=14, decimal_places=4, **kwargs)  # type: ignore[arg-type]


class PoolTarget(models.Model):
    """The utilization a pool should run at (0.8: full when 80% of its GPU-hours are asked
    for). Set by platform admins; absent, settings.GANTRY_CAPACITY_TARGET_UTILIZATION."""

    flavor = models.OneToOneField(ResourceFlavor, on_delete=models.CASCADE, related_name="+")
    target_utilization = models.DecimalField(max_digits=4, decimal_places=3)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(target_utilization__gt=0, target_utilization__lte=1),
                name="pool_target_fraction",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.flavor_id}: {self.target_utilization}"


class TcoInputs(models.Model):
    """What one GPU of a model costs to own and to rent, in the installation's currency.
    Entered by finance (or platform admins)."""

    flavor = models.OneToOneField(ResourceFlavor, on_delete=models.CASCADE, related_name="+")
    purchase_price = money(help_text="One GPU's share of the server, bought.")
    depreciation_months = models.PositiveSmallIntegerField()
    power_cooling_per_gpu_hour = money()
    hosting_support_per_month = money(help_text="Per GPU: rack, network, support contract.")
    on_demand_per_gpu_hour = money()
    committed_per_gpu_hour = money()
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(
                    purchase_price__gte=0,
                    power_cooling_per_gpu_hour__gte=0,
                    hosting_support_per_month__gte=0,
                    on_demand_per_gpu_hour__gte=0,
                    committed_per_gpu_hour__gte=0,
                    depreciation_months__gte=1,
                ),
                name="tco_inputs_not_negative",
            ),
        ]

    def __str__(self) -> str:
        return f"TCO of {self.flavor_id}"


class SuggestionState(models.TextChoices):
    PENDING = "pending"
    ACCEPTED = "accepted"
    REJECTED = "rejected"


class RateSuggestion(models.Model):
    """A GPU-hour price that recovers a model's cost of owning at a target utilization, with
    the inputs it came from (`explain`). Accepting it adds a rate card (billing's service)."""

    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.CASCADE, related_name="+")
    gpu_hour = money()
    target_utilization = models.DecimalField(max_digits=4, decimal_places=3)
    inputs = models.JSONField(default=dict)
    explain = models.TextField()
    state = models.CharField(
        max_length=8, choices=SuggestionState.choices, default=SuggestionState.PENDING
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField()
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True, default="")
    rate_card = models.ForeignKey(
        RateCard, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(condition=Q(gpu_hour__gte=0), name="rate_suggestion_price"),
            # One open suggestion per model: a new one replaces the pending one (services).
            models.UniqueConstraint(
                fields=["flavor"], condition=Q(state="pending"), name="rate_suggestion_one_open"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.flavor_id} at {self.gpu_hour} ({self.state})"
