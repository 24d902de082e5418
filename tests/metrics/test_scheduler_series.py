"""/metrics: Kueue's ClusterQueue series for Gantry's tenants (issue 20), over a small seeded
state whose figures are worked out in the comments.

The organisation (tests/conftest.py), H100 guarantee/limit in GPUs:
acme 64/64 -> research 32/64 -> team-alpha 16/32, team-bravo 16/32;
acme -> product 32/64 -> team-charlie 16/32.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import generate_latest
from prometheus_client.core import CollectorRegistry

from scheduler.metrics.exporter import GantryCollector
from scheduler.models import GpuDevice, Job, JobEvent, JobState
from tests import factories as f
from tests.conftest import Org
from tests.metrics.helpers import TOKEN, label_values, samples, scrape, value

S = JobState
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.get_fixed_timezone(0))
GPU = "nvidia.com/gpu"


@pytest.fixture(autouse=True)
def _token(settings: Any) -> None:
    settings.GANTRY_METRICS_TOKEN = TOKEN


def job(org: Org, tenant: str, **fields: Any) -> Job:
    project = {"alpha": org.proj_alpha, "bravo": org.proj_bravo, "charlie": org.proj_charlie}
    user = {"alpha": "alice", "bravo": "bob-bravo", "charlie": "chris"}[tenant]
    return f.JobFactory(project=project[tenant], submitted_by=org.users[user], **fields)


def event(job: Job, to_state: str, at: datetime, *, from_state: str = "", **fields: Any) -> None:
    made = JobEvent.objects.create(job=job, to_state=to_state, from_state=from_state, **fields)
    JobEvent.objects.filter(pk=made.pk).update(at=at)  # `at` is auto_now_add


def admitted(job: Job, queued_at: datetime, waited_s: float) -> None:
    event(job, S.QUEUED, queued_at, kind="submitted")
    event(job, S.ADMITTED, queued_at + timedelta(seconds=waited_s), from_state=S.QUEUED)


# -- pending -----------------------------------------------------------------------------------


def test_pending_jobs_per_tenant_and_status(org: Org) -> None:
    """Queued jobs not yet tried are active; those the engine gave a reason, or that sit out
    a retry backoff, inadmissible. Jobs awaiting approval are not in the queue."""
    job(org, "alpha")
    job(org, "alpha")
    job(org, "alpha", reason="quota: team-alpha uses 16/16 H100-80GB, limit 32; job needs 20")
    job(org, "alpha", not_before=timezone.now() + timedelta(minutes=5))
    job(org, "bravo", state=S.PENDING_APPROVAL, reason="waiting for approval")
    job(org, "bravo", state=S.RUNNING)
    text = scrape()
    assert value(text, "gantry_pending_workloads", cluster_queue="team-alpha", status="active") == 2
    assert (
        value(text, "gantry_pending_workloads", cluster_queue="team-alpha", status="inadmissible")
        == 2
    )
    for status in ("active", "inadmissible"):  # every tenant, zeros included, as Kueue does
        for tenant in ("team-bravo", "acme"):
            assert value(text, "gantry_pending_workloads", cluster_queue=tenant, status=status) == 0
    assert value(text, "gantry_admitted_active_workloads", cluster_queue="team-bravo") == 1
    assert value(text, "gantry_admitted_active_workloads", cluster_queue="team-alpha") == 0


# -- admission wait ----------------------------------------------------------------------------


def test_admission_wait_histogram_per_tenant_and_priority_class(org: Org) -> None:
    admitted(job(org, "alpha"), T0, 3)
    admitted(job(org, "alpha"), T0, 100)
    admitted(job(org, "bravo", priority_class=f.priority("high")), T0, 0.5)
    # A requeued job waits from its requeue, not from its submission: 1000 s, then 5 s.
    requeued = job(org, "bravo", priority_class=f.priority("high"))
    admitted(requeued, T0, 1000)
    back = T0 + timedelta(seconds=2000)
    event(requeued, S.PREEMPTED, back - timedelta(seconds=1), from_state=S.RUNNING)
    event(requeued, S.QUEUED, back, from_state=S.PREEMPTED)
    event(requeued, S.ADMITTED, back + timedelta(seconds=5), from_state=S.QUEUED)
    text = scrape()
    alpha = {"cluster_queue": "team-alpha", "priority_class": "normal"}
    name = "gantry_admission_wait_time_seconds"
    # Waits 3 s and 100 s: none within 2 s, one within 4 s (and 64 s), both within 128 s.
    assert value(text, f"{name}_bucket", le="2", **alpha) == 0
    assert value(text, f"{name}_bucket", le="4", **alpha) == 1
    assert value(text, f"{name}_bucket", le="64", **alpha) == 1
    assert value(text, f"{name}_bucket", le="128", **alpha) == 2
    assert value(text, f"{name}_count", **alpha) == 2
    assert value(text, f"{name}_sum", **alpha) == pytest.approx(103)
    bravo = {"cluster_queue": "team-bravo", "priority_class": "high"}
    # Waits 0.5, 1000 and 5 s: one within 1 s, two within 8 s, three within 1024 s.
    assert value(text, f"{name}_bucket", le="1", **bravo) == 1
    assert value(text, f"{name}_bucket", le="8", **bravo) == 2
    assert value(text, f"{name}_bucket", le="512", **bravo) == 2
    assert value(text, f"{name}_bucket", le="1024", **bravo) == 3
    assert value(text, f"{name}_sum", **bravo) == pytest.approx(1005.5)
    assert value(text, "gantry_admitted_workloads_total", cluster_queue="team-bravo") == 3
    assert value(text, "gantry_admitted_workloads_total", cluster_queue="team-alpha") == 2


# -- quota -------------------------------------------------------------------------------------


def test_usage_guarantee_limit_and_borrowed_per_tenant_and_flavor(org: Org) -> None:
    """team-bravo runs 20 GPUs on a guarantee of 16: it borrows 4. team-alpha runs 4. Usage
    rolls up the tree: research 24 of 32 (borrows nothing), acme 24. team-charlie's 8 GPUs
    are best-effort, which counts against no quota."""
    f.place(job(org, "bravo", state=S.RUNNING, replicas=4, gpus_per_replica=5,
                gpu_milli_per_replica=5000))  # fmt: skip
    f.place(job(org, "alpha", state=S.RUNNING, replicas=1, gpus_per_replica=4,
                gpu_milli_per_replica=4000))  # fmt: skip
    f.place(job(org, "charlie", state=S.RUNNING, gpus_per_replica=8, gpu_milli_per_replica=8000,
                priority_class=f.priority("best-effort")))  # fmt: skip
    text = scrape()

    def figure(name: str, tenant: str, cohort: str) -> float | None:
        labels = {"cluster_queue": tenant, "cohort": cohort, "flavor": "H100-80GB"}
        return value(text, f"gantry_cluster_queue_{name}", resource=GPU, **labels)

    assert figure("resource_usage", "team-bravo", "research") == 20
    assert figure("nominal_quota", "team-bravo", "research") == 16
    assert figure("borrowing_limit", "team-bravo", "research") == 16  # limit 32 - 16
    assert figure("borrowed_resources", "team-bravo", "research") == 4
    assert figure("resource_usage", "team-alpha", "research") == 4
    assert figure("borrowed_resources", "team-alpha", "research") == 0
    assert figure("resource_usage", "research", "acme") == 24
    assert figure("borrowed_resources", "research", "acme") == 0
    assert figure("resource_usage", "acme", "") == 24
    assert figure("borrowing_limit", "acme", "") == 0  # limit 64 = guarantee 64
    assert figure("resource_usage", "team-charlie", "product") == 0


# -- preemptions and evictions ----------------------------------------------------------------


def test_preemptions_and_evictions_by_reason(org: Org) -> None:
    """Each `preempted` event: by the engine (it names the preemptor) or by a drain."""
    alpha_urgent = job(org, "alpha", state=S.RUNNING, priority_class=f.priority("high"))
    bravo_job = job(org, "bravo", state=S.RUNNING)
    alpha_victim = job(org, "alpha", state=S.QUEUED)
    bravo_victim = job(org, "bravo", state=S.QUEUED)
    charlie_spot = job(org, "charlie", state=S.QUEUED, priority_class=f.priority("best-effort"))
    charlie_drained = job(org, "charlie", state=S.QUEUED)

    def preempted(victim: Job, by: Job | None) -> None:
        data = {"preemptor": str(by.pk)} if by is not None else {}
        event(victim, S.PREEMPTED, T0, from_state=S.RUNNING, kind="preempted", data=data)

    preempted(bravo_victim, alpha_urgent)  # alpha reclaims its guarantee from bravo
    preempted(alpha_victim, alpha_urgent)  # higher priority within team-alpha
    preempted(charlie_spot, bravo_job)  # a best-effort job gives way to anyone
    preempted(charlie_drained, None)  # node drained
    text = scrape()
    assert samples(text, "gantry_preempted_workloads_total") == {
        (("preempting_cluster_queue", "team-alpha"), ("reason", "InClusterQueue")): 1,
        (("preempting_cluster_queue", "team-alpha"), ("reason", "InCohortReclamation")): 1,
        (("preempting_cluster_queue", "team-bravo"), ("reason", "InCohortBestEffort")): 1,
    }
    assert samples(text, "gantry_evicted_workloads_total") == {
        (("cluster_queue", "team-alpha"), ("reason", "Preempted")): 1,
        (("cluster_queue", "team-bravo"), ("reason", "Preempted")): 1,
        (("cluster_queue", "team-charlie"), ("reason", "NodeDrained")): 1,
        (("cluster_queue", "team-charlie"), ("reason", "Preempted")): 1,
    }


# -- who reads it, what it names, what it costs ------------------------------------------------


def test_only_operators_read_the_tenant_series(org: Org) -> None:
    """Tenant slugs appear on /metrics, which only a scraper's token and platform admins
    read (docs/faults.md 31): tenant admins, members and finance get 404 as before."""
    job(org, "alpha")
    for name in ("alice", "tina", "dana", "carol"):
        client = Client()
        client.force_login(org.users[name])
        assert client.get("/metrics").status_code == 404, name
    admin = Client()
    admin.force_login(org.users["pat"])
    assert "team-alpha" in scrape(admin)


def test_labels_name_tenants_flavors_and_classes_only(org: Org) -> None:
    """No user, project, namespace or job name reaches a label (docs/faults.md 31)."""
    waiting = job(org, "alpha", name="secret-llm-run", reason="quota: team-alpha ...")
    admitted(waiting, T0, 7)
    running = job(org, "bravo", state=S.RUNNING, name="bravo-private")
    f.place(running)
    event(waiting, S.PREEMPTED, T0, kind="preempted", data={"preemptor": str(running.pk)})
    text = scrape()
    values = label_values(text)
    assert {"team-alpha", "team-bravo", "research", "H100-80GB", "normal"} <= values
    for secret in ("alice", "bob-bravo", "proj-alpha", "secret-llm-run", "bravo-private",
                   org.proj_alpha.namespace, org.proj_bravo.namespace):  # fmt: skip
        assert secret not in text, secret


def _queries_of_a_scrape() -> int:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GantryCollector())
    with CaptureQueriesContext(connection) as captured:
        generate_latest(registry)
    return len(captured.captured_queries)


# jobs, demand, devices, nodes, the lease, pending, quota (3), fragmentation (2): 11; the
# job-event counters (scheduler/metrics/tally.py): 5, and 2 more when events settle into the
# totals; the savepoint of the test's transaction around them: 2; billing's last usage
# check (billing/metering/gaps.py): 1.
SCRAPE_QUERIES = 11 + 5 + 2 + 1
SETTLING = 2


def test_a_scrape_costs_a_fixed_number_of_queries(org: Org) -> None:
    """Whatever the number of tenants, jobs, events and devices: one query per gauge family
    (the quotas three, fragmentation two), a fixed few for the counters, none per row."""
    _queries_of_a_scrape()  # the first scrape ever makes the counters' watermark row
    assert _queries_of_a_scrape() == SCRAPE_QUERIES
    node = f.NodeFactory()
    for index in range(4):
        GpuDevice.objects.create(node=node, index=index)
    for tenant in ("alpha", "bravo", "charlie"):
        for _ in range(3):
            admitted(job(org, tenant), T0, 9)
            f.place(job(org, tenant, state=S.RUNNING), node)
    extra = f.TenantFactory(slug="team-delta", parent=org.product)
    f.QuotaFactory(tenant=extra, flavor=org.h100, guaranteed_milli=0, limit_milli=8000)
    assert _queries_of_a_scrape() == SCRAPE_QUERIES + SETTLING  # the admissions settle
    assert _queries_of_a_scrape() == SCRAPE_QUERIES
