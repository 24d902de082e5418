"""A demo-like state of costs for the screenshots of the costs pages: the demo organisation
(scheduler/demo/seed.py), rate cards for its four GPU models (the A100 cheaper three months ago),
its jobs holding devices for twelve hours of each of the last six months, metered, and budgets
of this month for two departments and a team.

Only those hours are metered (metering the whole half-year hour by hour would take minutes),
so the figures are the metered hours' and the months' statements could not be closed.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from billing.metering.hourly import meter_hour
from billing.models import Budget, BudgetUnit
from billing.periods import month_starts
from billing.rates.cards import RatePrices, rate_card_add
from scheduler.demo.seed import seed_demo
from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobState, Node
from tenants.models import ResourceFlavor, Tenant
from tests import factories as f
from tests.portal.browser.conftest import PASSWORD

HOUR = timedelta(hours=1)
PRICES = {  # flavor: GPU-hour, then from three months ago
    "H100-80GB": (Decimal("4.00"), Decimal("4.00")),
    "A100-40GB": (Decimal("2.50"), Decimal("2.20")),
    "L40S-48GB": (Decimal("1.80"), Decimal("1.80")),
    "T4-16GB": (Decimal("0.60"), Decimal("0.60")),
}
# job name (the demo's), node, first device, GPUs per replica, hours held in month k (0: oldest)
HOLDINGS = [
    ("llama-8b-pretrain", "h100", 0, 8, [4, 6, 8, 10, 12, 9]),
    ("mmlu-eval", "a100", 0, 1, [2, 3, 2, 4, 3, 2]),
    ("yolo-finetune", "a100", 1, 4, [6, 4, 8, 6, 10, 7]),
    ("ranker-batch-scoring", "t4", 0, 1, [8, 8, 10, 12, 12, 11]),
    ("chat-7b-serving", "l40s", 0, 1, [12, 12, 12, 12, 12, 11]),
]


@dataclass
class CostDemo:
    now: datetime
    running: Job  # holds devices now, partly not metered yet


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def _node(name: str, flavor: str) -> Node:
    node = f.NodeFactory(name=name, flavor=flavor)
    for index in range(8):
        GpuDevice.objects.create(node=node, index=index, model=flavor, memory_mib=40960)
    return node


def _hold(
    job: Job, node: Node, replica: int, start: datetime, end: datetime | None, first: int, gpus: int
) -> None:
    allocation = Allocation.objects.create(
        job=job,
        node=node,
        replica=replica,
        attempt=job.attempt,
        pod_name=f"gantry-{job.pk}-a{job.attempt}-r{replica}-{start:%m%d%H}",
        namespace=job.project.namespace,
        flavor=node.flavor,
        gpu_milli=gpus * 1000,
        started_at=start,
        ended_at=end,
    )
    devices = GpuDevice.objects.filter(node=node).order_by("index")
    for offset in range(gpus):
        AllocationDevice.objects.create(
            allocation=allocation,
            device=devices[first + offset],
            milli=1000,
            released=end is not None,
        )


def build_cost_demo(now: datetime | None = None) -> CostDemo:
    now = now or datetime.now(UTC)
    seed_demo()
    users = {u.username: u for u in f.UserFactory._meta.model.objects.all()}
    for user in users.values():
        user.set_password(PASSWORD)
        user.save(update_fields=["password"])
    admin = users["admin"]
    months = month_starts(now, 6)
    for name, (before, after) in PRICES.items():
        flavor = ResourceFlavor.objects.get(name=name)
        rate_card_add(
            user=admin,
            flavor=flavor,
            valid_from=months[0] - 24 * HOUR,
            prices=RatePrices(before, Decimal("0.03"), Decimal("0.004")),
        )
        if after != before:
            rate_card_add(
                user=admin,
                flavor=flavor,
                valid_from=months[3],
                prices=RatePrices(after, Decimal("0.03"), Decimal("0.004")),
            )
    nodes = {
        "h100": [_node("gpu-h100-0", "H100-80GB"), _node("gpu-h100-1", "H100-80GB")],
        "a100": [_node("gpu-a100-0", "A100-40GB")],
        "l40s": [_node("gpu-l40s-0", "L40S-48GB")],
        "t4": [_node("gpu-t4-0", "T4-16GB")],
    }
    # Twelve hours of each month: the 2nd from 08:00, and this month the last twelve closed.
    windows = [month + timedelta(days=1, hours=8) for month in months[:-1]]
    windows.append(_hour(now) - 14 * HOUR)
    running = Job.objects.get(name="llama-8b-pretrain")
    for name, kind, first, gpus, hours in HOLDINGS:
        job = Job.objects.get(name=name)
        for k, start in enumerate(windows):
            last = k == len(windows) - 1 and job == running
            for replica in range(job.replicas):
                node = nodes[kind][replica % len(nodes[kind])]
                end = None if last else start + hours[k] * HOUR
                begin = _hour(now) - 3 * HOUR if last else start
                _hold(
                    job, node, replica, begin, end, first + replica * gpus * (kind != "h100"), gpus
                )
    Job.objects.filter(pk=running.pk).update(state=JobState.RUNNING)
    for start in windows:
        for hour in range(12):
            meter_hour(start + hour * HOUR, now=now)
    # Budgets of this month, for the burn-down: two departments in money, a team in GPU-hours.
    for slug, unit, limit in [
        ("research", BudgetUnit.MONEY, "1500.00"),
        ("product", BudgetUnit.MONEY, "400.00"),
        ("nlp", BudgetUnit.GPU_HOURS, "300.00"),
    ]:
        Budget.objects.create(
            tenant=Tenant.objects.get(slug=slug), month=months[-1], unit=unit, limit=Decimal(limit)
        )
    running.refresh_from_db()
    return CostDemo(now=now, running=running)


__all__: list[Any] = ["CostDemo", "build_cost_demo"]
