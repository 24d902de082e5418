"""The demo organisation's prices, so that `make run` shows what jobs cost from the start.

The organisation itself is `scheduler.demo.seed`; billing sits above the scheduler in the layers,
so its part of the demo is seeded here, by the same `manage.py seed_demo`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db import transaction

from billing.models import RateCard
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.demo.seed import FLAVORS
from tenants.models import ResourceFlavor

# flavor -> price of a GPU-hour, in the platform's currency; CPU and memory as cloud lists do.
GPU_HOUR = {
    "H100-80GB": Decimal("3.00"),
    "A100-40GB": Decimal("1.60"),
    "L40S-48GB": Decimal("1.10"),
    "T4-16GB": Decimal("0.35"),
}
CPU_CORE_HOUR = Decimal("0.03")
MEMORY_GIB_HOUR = Decimal("0.004")
ADMIN = "admin"  # the demo's platform admin (scheduler.demo.seed.USERS) adds the cards


@transaction.atomic
def seed_demo_prices(now: datetime | None = None) -> int:
    """A rate card for each demo flavor without one, valid from the start of yesterday (UTC)
    on: on the hour, before any demo job ran, and before a card someone adds for this hour.
    Returns how many were added; a second run adds none."""
    start = (now or datetime.now(UTC)).replace(hour=0, minute=0, second=0, microsecond=0)
    admin = get_user_model().objects.filter(username=ADMIN).first()
    if admin is None:  # the demo's admin was removed: this is no longer a demo to price
        return 0
    added = 0
    for name, *_ in FLAVORS:
        flavor = ResourceFlavor.objects.get(name=name)
        if RateCard.objects.filter(flavor=flavor).exists():
            continue
        rate_card_add(
            user=admin,
            flavor=flavor,
            valid_from=start - timedelta(days=1),
            prices=RatePrices(GPU_HOUR[name], CPU_CORE_HOUR, MEMORY_GIB_HOUR),
        )
        added += 1
    return added
