"""A small queue as the daemon's estimates refresh stores it (scheduler/estimates/refresh.py), for
the tests of what the API, the portal and the CLI show of it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduler.models import Job, JobQueueEstimate
from tests import factories as f
from tests.conftest import Org


@dataclass
class Queue:
    bravo: Job  # bob's, first in the cluster
    first: Job  # alice's, second
    second: Job  # alice's, third: the one looked at
    now: datetime


def small_queue(org: Org, now: datetime) -> Queue:
    """bravo (team-bravo) 1st, first (alpha) 2nd, second (alpha) 3rd; second waits for a
    reservation of bravo's job (its reason names it) and starts in 40 .. 90 minutes."""
    bravo = f.JobFactory(project=org.proj_bravo, submitted_by=org.users["bob-bravo"])
    first = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    second = f.JobFactory(
        project=org.proj_alpha,
        submitted_by=org.users["alice"],
        reason=f"waiting for reservation of job {bravo.pk}, expected in 3 min",
    )
    for job, in_tenant, in_cluster, eta in [
        (bravo, 1, 1, 5),
        (first, 1, 2, 20),
        (second, 2, 3, 40),
    ]:
        JobQueueEstimate.objects.create(
            job=job,
            position_tenant=in_tenant,
            position_cluster=in_cluster,
            eta_p50=now + timedelta(minutes=eta),
            eta_p90=now + timedelta(minutes=eta + 50),
            estimated_at=now,
            computed_at=now,
        )
    return Queue(bravo, first, second, now)
