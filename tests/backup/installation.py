"""An installation with something of everything in it, and every row of it, for the backup
and upgrade tests (issue 40).

`fill(env)` leaves, on the simulated cluster of `env` (4 nodes x 8 H100):

- running: a gang (2 x 4 GPUs), an 8-GPU job, a fractional one (0.5 GPU), all team-alpha's,
  and bob's 8 GPUs in team-bravo; a 4-GPU job of team-alpha beyond its 16-GPU guarantee
  (borrowed); 28.5 of 32 GPUs held;
- queued: team-alpha's second 8-GPU job, which fits its limit but not the cluster;
- pending approval: bob's 16 GPUs (team-bravo's policy: over 8 GPUs), and one rejected;
- cancelled: one of chris's; a quota set by pat (audited);
- one metered hour and a closed statement for it (a rate card of 2.00 a GPU-hour).

Uses only services that every release since 1.0.0 has, so that the upgrade test can run it
in the previous release's tree as well.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.apps import apps
from django.core import serializers
from django.db.models import Min

from billing.metering.hourly import floor_hour, meter_usage
from billing.rates.cards import RatePrices, rate_card_add
from billing.statements.closing import statement_close
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import Allocation, Job
from tenants.approvals import approval_decide
from tenants.models import ApprovalPolicy, ApprovalRequest
from tenants.quotas.rules import QuotaValues
from tenants.services import quota_set
from tests.conftest import job_spec

HOUR = timedelta(hours=1)
LONG = {"duration_s": 100_000}  # runs through every test's hours
APPS = ("auth", "authtoken", "tenants", "scheduler", "billing", "whatif")


@dataclass(frozen=True)
class Filled:
    jobs: dict[str, int]  # what each job stands for -> its id
    metered_hour: datetime


def fill(env: Any, daemon: Any, settle: Callable[[], None] | None = None) -> Filled:
    """Fill the installation through the services and `daemon` (which runs on `env`'s
    clock); see the module docstring for what it leaves. `settle()` runs the daemon until
    what it placed runs (default: two cycles, enough on the simulated cluster)."""
    settle = settle or (lambda: env.run(daemon, seconds=2, cycles=2))
    org, pat = env.org, env.org.users["pat"]
    rate_card_add(user=pat, flavor=org.h100, valid_from=datetime(2020, 1, 1, tzinfo=UTC),
                  prices=RatePrices(Decimal(2)))  # fmt: skip
    ApprovalPolicy.objects.create(tenant=org.bravo, rule="gpus_over", threshold=8)
    gpu8 = {"resources": {"gpus": 8}, "replicas": 1, "simulation": LONG}
    jobs = {
        "gang": env.submit(resources={"gpus": 4}, replicas=2, simulation=LONG),
        "running": env.submit(**gpu8),
        "fractional": env.submit(
            resources={"gpu_milli": 500, "gpu_memory_mib": 20000}, type="inference", simulation=LONG
        ),
        "bravo": env.submit("bob-bravo", **gpu8),
    }
    settle()
    jobs["borrowed"] = env.submit(resources={"gpus": 4}, simulation=LONG)
    settle()
    jobs["queued"] = env.submit(**gpu8)
    jobs["awaiting"] = env.submit("bob-bravo", **{**gpu8, "replicas": 2})
    jobs["rejected"] = env.submit("bob-bravo", **{**gpu8, "replicas": 2})
    jobs["cancelled"] = submit(org, "chris", **gpu8)
    job_cancel(user=org.users["chris"], job=jobs["cancelled"], reason="wrong data")
    request = ApprovalRequest.objects.get(kind="job", subject_id=jobs["rejected"].pk)
    approval_decide(user=org.users["dana"], request=request, approve=False, comment="too big")
    quota_set(user=pat, tenant=org.charlie, flavor=org.h100,
              values=QuotaValues(12000, 32000, None, 1.0))  # fmt: skip
    settle()
    # 1. meter the first whole hour the jobs ran, 2. close its statement
    first = Allocation.objects.aggregate(first=Min("started_at"))["first"]
    hour = floor_hour(first)
    meter_usage(now=hour + 3 * HOUR)
    statement_close(user=pat, organisation=org.acme, start=hour, end=hour + HOUR,
                    now=hour + 3 * HOUR)  # fmt: skip
    return Filled({k: v.pk for k, v in jobs.items()}, hour)


def submit(org: Any, user: str, **overrides: Any) -> Job:
    """A job of `user` in their team's project (alice: alpha, bob-bravo: bravo, chris: charlie)."""
    project = {"alice": org.proj_alpha, "bob-bravo": org.proj_bravo, "chris": org.proj_charlie}
    spec = job_spec(**{"replicas": 1, **overrides})
    job, _ = job_submit(user=org.users[user], project=project[user], payload=spec)
    return job


def job_states(filled: Filled) -> dict[str, tuple[str, int]]:
    by_id = {j.pk: (j.state, j.attempt) for j in Job.objects.filter(pk__in=filled.jobs.values())}
    return {name: by_id[pk] for name, pk in filled.jobs.items()}


def cost_lines(hour: datetime) -> Any:
    """The cost lines of [hour, hour + 1 h) per project, as finance reads them from the API."""
    from rest_framework.test import APIClient

    from tenants.models import PlatformRole

    api = APIClient()
    api.force_authenticate(PlatformRole.objects.get(role="finance").user)
    window = {"from": hour.isoformat(), "to": (hour + HOUR).isoformat(), "by": "project"}
    response = api.get("/api/v1/costs/", window)
    assert response.status_code == 200, response.json()
    return response.json()


def every_row() -> dict[str, str]:
    """Every row of the project's tables and of the users and tokens, serialised per model:
    two installations with equal results hold the same data."""
    out = {}
    for label in APPS:
        for model in apps.get_app_config(label).get_models():
            if model._meta.managed and not model._meta.proxy:
                rows = model._default_manager.order_by("pk")
                out[model._meta.label] = serializers.serialize("json", rows)
    return out
