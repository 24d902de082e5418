"""Prometheus metrics, computed from the database at scrape time (docs/metrics.md).

/metrics is for operators of the platform only: a scraper's bearer token or a platform admin,
everyone else 404 (docs/faults.md 31). It carries tenant slugs (Kueue's `cluster_queue`, `cohort`),
flavors and priority classes, which platform admins see anyway; never a user, project, job or
namespace. Per tenant figures for tenants' own people live behind the API's access rules.
A scrape costs a fixed number of queries whatever the size of the cluster (a test pins it).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CollectorRegistry, GaugeMetricFamily
from prometheus_client.registry import Collector

from scheduler.metrics.cluster_queues import (
    pending_families,
    preemption_families,
    quota_families,
    wait_families,
)
from scheduler.metrics.fragmentation import fragmentation_families
from scheduler.metrics.tally import job_event_tallies
from scheduler.models import GpuDevice, Job, JobState, Node, SchedulerLease

# Families of the apps above the scheduler (billing's reconciliation), registered at their
# start-up: the scheduler may not import them.
_REGISTERED: list[Callable[[], Iterable[Any]]] = []


def register_families(source: Callable[[], Iterable[Any]]) -> None:
    if source not in _REGISTERED:
        _REGISTERED.append(source)


class GantryCollector(Collector):
    def collect(self) -> Iterator[Any]:
        for source in _REGISTERED:
            yield from source()
        yield self._jobs()
        yield self._demand()
        yield from self._devices()
        yield self._nodes()
        yield from self._leader()
        yield from pending_families()
        tallies = job_event_tallies(now=timezone.now())
        yield from wait_families(tallies)
        yield from quota_families()
        yield from preemption_families(tallies)
        yield from fragmentation_families()

    def _jobs(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily("gantry_jobs", "Jobs by state.", labels=["state"])
        counts = dict(Job.objects.values_list("state").annotate(n=Count("id")))
        for state in JobState.values:
            family.add_metric([state], counts.get(state, 0))
        return family

    def _demand(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "gantry_jobs_gpu_milli",
            "GPU (milli-GPU) asked for by jobs, by state.",
            labels=["state"],
        )
        rows = (
            Job.objects.filter(
                state__in=[JobState.QUEUED, JobState.PENDING_APPROVAL, JobState.RUNNING]
            )
            .values_list("state")
            .annotate(total=Sum(F("replicas") * F("gpu_milli_per_replica")))
        )
        for state, total in rows:
            family.add_metric([state], total or 0)
        return family

    def _devices(self) -> Iterator[GaugeMetricFamily]:
        devices = GaugeMetricFamily(
            "gantry_gpu_devices", "GPU devices by model and health.", labels=["flavor", "healthy"]
        )
        allocated = GaugeMetricFamily(
            "gantry_gpu_allocated_milli", "Allocated milli-GPU by model.", labels=["flavor"]
        )
        rows = (
            GpuDevice.objects.filter(node__present=True)
            .values("node__flavor")
            .annotate(
                n_healthy=Count("id", filter=Q(healthy=True)),
                n_unhealthy=Count("id", filter=Q(healthy=False)),
                allocated=Sum("allocated_milli"),
            )
        )
        for row in rows:
            devices.add_metric([row["node__flavor"], "true"], row["n_healthy"])
            devices.add_metric([row["node__flavor"], "false"], row["n_unhealthy"])
            allocated.add_metric([row["node__flavor"]], row["allocated"] or 0)
        yield devices
        yield allocated

    def _nodes(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "gantry_nodes", "Nodes present in the cluster.", labels=["ready", "cordoned"]
        )
        rows = (
            Node.objects.filter(present=True)
            .values_list("ready", "cordoned")
            .annotate(n=Count("id"))
            .order_by()
        )
        for ready, cordoned, n in rows:
            family.add_metric([str(ready).lower(), str(cordoned).lower()], n)
        return family

    def _leader(self) -> Iterator[GaugeMetricFamily]:
        epoch = GaugeMetricFamily(
            "gantry_scheduler_epoch", "Epoch of the scheduler lease (rises at each takeover)."
        )
        failures = GaugeMetricFamily(
            "gantry_scheduler_cycle_failures",
            "Scheduling cycles failed since the last completed one.",
        )
        completed = GaugeMetricFamily(
            "gantry_scheduler_last_cycle_timestamp_seconds",
            "When the scheduler last recorded a completed cycle (Unix time; 0: never).",
        )
        lease = (
            SchedulerLease.objects.order_by("-epoch")
            .values("epoch", "cycle_failures", "cycle_ok_at")
            .first()
        ) or {"epoch": 0, "cycle_failures": 0, "cycle_ok_at": None}
        epoch.add_metric([], lease["epoch"] or 0)
        failures.add_metric([], lease["cycle_failures"])
        ok_at = lease["cycle_ok_at"]
        completed.add_metric([], ok_at.timestamp() if ok_at is not None else 0)
        yield epoch
        yield failures
        yield completed


def scrape_allowed(request: HttpRequest) -> bool:
    """A scraper's bearer token (GANTRY_METRICS_TOKEN), or a platform admin's session/token."""
    expected = getattr(settings, "GANTRY_METRICS_TOKEN", "")
    header = request.headers.get("Authorization", "")
    if expected and header.startswith("Bearer "):
        return hmac.compare_digest(header.removeprefix("Bearer ").encode(), expected.encode())
    from rest_framework.exceptions import AuthenticationFailed

    from common.api.tokens import ExpiringTokenAuthentication
    from tenants.access import grants_for

    user: Any = request.user if request.user.is_authenticated else None
    if user is None and header.startswith("Token "):
        try:
            found = ExpiringTokenAuthentication().authenticate(request)  # type: ignore[arg-type]
        except AuthenticationFailed:
            found = None
        user = found[0] if found else None
    return user is not None and grants_for(user).platform_admin


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not scrape_allowed(request):
        return HttpResponse("Not found.\n", status=404, content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GantryCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
