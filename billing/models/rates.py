"""Rate cards and their multipliers per priority class. Money is `Decimal`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from tenants.models import PriorityClass, ResourceFlavor


def price(**kwargs: Any) -> models.DecimalField:
    """A price per unit-hour: up to 10^8 with 6 decimal places (a GiB-hour costs little)."""
    return models.DecimalField(max_digits=14, decimal_places=6, **kwargs)


class RateCard(models.Model):
    """One effective-dated version of a flavor's prices, valid on [valid_from, valid_to).

    The versions of a flavor on one cluster (or of its default card, `cluster` null) form one
    unbroken chain: each starts where the previous ends (`billing.rates.cards.rate_card_add`
    refuses gaps and overlaps); the last may be open-ended (`valid_to` null). A version is
    never changed once the time it covers has been metered, except that the open end of the
    last one is closed when a newer version is added.
    """

    flavor = models.ForeignKey(ResourceFlavor, on_delete=models.PROTECT, related_name="rate_cards")
    # The cluster whose usage these prices rate (issue 38); null: the default card, which
    # rates every cluster without a chain of its own at that time. Each (flavor, cluster)
    # has its own chain, and so has (flavor, default).
    cluster = models.ForeignKey(
        "scheduler.Cluster",
        null=True,
        blank=True,
        db_index=False,
        on_delete=models.PROTECT,
        related_name="rate_cards",
    )
    valid_from = models.DateTimeField()
    valid_to = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3)
    gpu_hour = price(help_text="Price of one whole device for an hour.")
    cpu_core_hour = price(default=0)
    memory_gib_hour = price(default=0)
    # A fraction off the price of capacity borrowed beyond the tenant's guarantee (0.3 = 30 %).
    borrowed_discount = models.DecimalField(max_digits=5, decimal_places=4, default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["flavor_id", "cluster_id", "valid_from"]
        constraints = [
            models.UniqueConstraint(
                fields=["flavor", "valid_from"],
                condition=Q(cluster__isnull=True),
                name="rate_card_default_one_start",
            ),
            models.UniqueConstraint(
                fields=["flavor", "cluster", "valid_from"],
                condition=Q(cluster__isnull=False),
                name="rate_card_cluster_one_start",
            ),
            models.UniqueConstraint(
                fields=["flavor"],
                condition=Q(valid_to__isnull=True, cluster__isnull=True),
                name="rate_card_default_one_open",
            ),
            models.UniqueConstraint(
                fields=["flavor", "cluster"],
                condition=Q(valid_to__isnull=True, cluster__isnull=False),
                name="rate_card_cluster_one_open",
            ),
            models.CheckConstraint(
                condition=Q(valid_to__isnull=True) | Q(valid_to__gt=F("valid_from")),
                name="rate_card_ends_after_start",
            ),
            models.CheckConstraint(
                condition=Q(gpu_hour__gte=0, cpu_core_hour__gte=0, memory_gib_hour__gte=0),
                name="rate_card_prices_not_negative",
            ),
            models.CheckConstraint(
                condition=Q(borrowed_discount__gte=0, borrowed_discount__lte=1),
                name="rate_card_discount_fraction",
            ),
        ]

    def __str__(self) -> str:
        where = f" on cluster {self.cluster_id}" if self.cluster_id else ""
        return f"{self.flavor_id}{where} from {self.valid_from:%Y-%m-%d %H:%M}"


class RateMultiplier(models.Model):
    """A priority class's price multiplier within one rate card version (absent: 1)."""

    rate_card = models.ForeignKey(RateCard, on_delete=models.CASCADE, related_name="multipliers")
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="+")
    multiplier = models.DecimalField(max_digits=6, decimal_places=4)

    class Meta:
        ordering = ["rate_card_id", "priority_class_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["rate_card", "priority_class"], name="rate_multiplier_once"
            ),
            models.CheckConstraint(
                condition=Q(multiplier__gte=0), name="rate_multiplier_not_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"x{self.multiplier} for {self.priority_class_id}"
