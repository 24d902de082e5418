"""Quota use is computed in one place (issue 19): the engine's admission, the approval rules
and the "in use" figure of the portal and the API count the same GPUs of a tenant's
subtree, each on the flavor of its allocation."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduler.backends.simulated.cluster import SimulatedCluster
from scheduler.backends.simulated.inventory import make_nodes
from scheduler.core.cycle import build_context
from scheduler.core.quota import running_claims, subtree_usage
from scheduler.daemon.loop import Daemon
from scheduler.jobs.services import job_submit
from scheduler.leader import Lease
from scheduler.metrics.cluster_queues import quota_families
from scheduler.models import Allocation, Job, JobState
from scheduler.snapshot.build import build_snapshot
from scheduler.snapshot.quota_usage import quota_rows, usage_by_tenant
from tenants.models import ApprovalPolicy, Quota, Tenant
from tests import factories as f
from tests.conftest import Org, job_spec
from tests.daemon.conftest import FakeClock

BOTH = ["A100-40GB", "H100-80GB"]


def test_in_use_counts_a_job_on_its_allocations_flavor_not_its_first_allowed(
    org: Org, client_for: Any
) -> None:
    # alpha may run on A100 or H100 (A100 first); the job landed on H100
    for tenant in (org.acme, org.research, org.alpha):
        _quota(tenant, org.a100, 8, 8)
    job = f.JobFactory(
        project=org.proj_alpha,
        state=JobState.RUNNING,
        replicas=2,
        gpu_milli_per_replica=4000,
        flavors=BOTH,
    )
    f.place(job, f.NodeFactory(flavor="H100-80GB"))
    rows = {row.flavor.name: row.used_milli for row in quota_rows([org.alpha])}
    assert rows == {"A100-40GB": 0, "H100-80GB": 8000}
    api = client_for("alice").get("/api/v1/usage/").json()
    assert {r["flavor_name"]: r["used_milli"] for r in api} == rows


def _quota(tenant: Tenant, flavor: Any, guaranteed: int, limit: int) -> None:
    f.QuotaFactory(
        tenant=tenant, flavor=flavor, guaranteed_milli=guaranteed * 1000, limit_milli=limit * 1000
    )


def _submit(org: Org, user: str = "alice", **spec: Any) -> Job:
    project = org.proj_alpha if user == "alice" else org.proj_bravo
    payload = job_spec(**{"replicas": 1, "resources": {"gpus": 4}, **spec})
    job, _ = job_submit(user=org.users[user], project=project, payload=payload)
    return job


@pytest.fixture
def mixed(org: Org) -> Daemon:
    """A mixed tree, run by the daemon on a simulated cluster of two H100 nodes and one
    A100 node: bravo runs 7 H100; alpha runs 8 H100 of best-effort (charged to nobody), then
    a 4-GPU job that allows A100 and H100 and finds only A100 room, and 1 GPU on H100."""
    for tenant, guaranteed, limit in [(org.acme, 8, 8), (org.research, 8, 8), (org.alpha, 8, 8)]:
        _quota(tenant, org.a100, guaranteed, limit)
    nodes = [
        *make_nodes(2, "H100-80GB", 8, prefix="h100"),
        *make_nodes(1, "A100-40GB", 8, memory_mib=40960, prefix="a100"),
    ]
    clock = FakeClock()
    backend = SimulatedCluster(
        nodes, clock=clock, start_delay_s=1.0, grace_cap_s=2.0, retry_sleep=lambda _s: None
    )
    daemon = Daemon(backend, lease=Lease("quota-usage", ttl_s=30), clock=clock, sleep=lambda _s: 0)

    def run() -> None:
        for _ in range(2):
            clock.advance(2)
            daemon.step()

    sim = {"simulation": {"duration_s": 10_000}}
    _submit(org, "bob-bravo", resources={"gpus": 7}, **sim)
    _submit(org, resources={"gpus": 8}, priority_class="best-effort", **sim)
    run()
    _submit(org, name="either", flavors=BOTH, **sim)
    run()
    _submit(org, name="small", resources={"gpus": 1}, **sim)
    run()
    held = dict(Allocation.objects.filter(ended_at__isnull=True).values_list("job__name", "flavor"))
    assert held["either"] == "A100-40GB", held  # the case the figures differ on
    assert Job.objects.filter(state=JobState.RUNNING).count() == 4
    return daemon


def test_engine_portal_and_approvals_agree_on_a_tenants_usage(
    org: Org, mixed: Daemon, client_for: Any
) -> None:
    tenants = list(Tenant.objects.order_by("path"))
    # the engine's admission: its ledger over the daemon's own snapshot
    snapshot = build_snapshot(mixed.clock(), decayed={}).snapshot
    ctx = build_context(snapshot, mixed.profile)
    engine = {key: milli for key, milli in ctx.ledger.usage.items() if milli}
    shared = subtree_usage(
        running_claims(snapshot.running, ctx.counts_against_quota), ctx.ledger.chain.__getitem__
    )
    assert engine == shared
    # the database's reader, the portal's rows and the API
    used = usage_by_tenant(tenants)
    by_db = {(t.slug, fl): m for t in tenants for fl, m in used[t.pk].items() if m}
    assert (
        by_db
        == engine
        == {
            ("acme", "H100-80GB"): 8000,
            ("research", "H100-80GB"): 8000,
            ("team-alpha", "H100-80GB"): 1000,  # not the best-effort 8
            ("team-bravo", "H100-80GB"): 7000,
            ("acme", "A100-40GB"): 4000,
            ("research", "A100-40GB"): 4000,
            ("team-alpha", "A100-40GB"): 4000,  # where it runs, not each flavor it allows
        }
    )
    metrics = next(
        family
        for family in quota_families()
        if family.name == "gantry_cluster_queue_resource_usage"
    )
    gauged = {(m.labels["cluster_queue"], m.labels["flavor"]): m.value for m in metrics.samples}
    assert {key: gpus * 1000 for key, gpus in gauged.items() if gpus} == engine
    rows = {(r.tenant.slug, r.flavor.name): r.used_milli for r in quota_rows(tenants)}
    assert rows == {key: engine.get(key, 0) for key in rows}
    api = client_for("dana").get("/api/v1/usage/").json()
    assert {(r["tenant_slug"], r["flavor_name"]): r["used_milli"] for r in api} == {
        ("research", "A100-40GB"): 4000,
        ("research", "H100-80GB"): 8000,
    }
    # the approval rules: alpha's H100 guarantee set to what it uses and 8 more; an 8-GPU
    # H100 job fits it, and a second, with the first queued, borrows. Counting the A100 job
    # against H100 too, or the best-effort job, would send the first one for approval.
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="borrowing")
    Quota.objects.filter(tenant=org.alpha, flavor=org.h100).update(guaranteed_milli=9000)
    first = _submit(org, name="first", resources={"gpus": 8})
    assert first.state == JobState.QUEUED, first.reason
    second = _submit(org, name="second", resources={"gpus": 8})
    assert second.state == JobState.PENDING_APPROVAL, second.reason


def test_a_model_held_without_a_quota_is_shown_borrowed(org: Org, client_for: Any) -> None:
    # alpha sets no T4 quota; its job borrowed T4s from the cluster. The quota tables and the
    # usage API listed only the models with a quota, while the dashboards and the bill
    # showed the T4s: now a row says they are held, borrowed, with no limit of alpha's own.
    job = f.JobFactory(project=org.proj_alpha, state=JobState.RUNNING, gpu_milli_per_replica=1000)
    f.place(job, f.NodeFactory(flavor="T4-16GB"))
    f.FlavorFactory(name="T4-16GB")
    rows = {r.flavor.name: r for r in quota_rows([org.alpha])}
    t4 = rows["T4-16GB"]
    assert (t4.used_milli, t4.guaranteed_milli, t4.limit_milli) == (1000, 0, None)
    assert not t4.quota and t4.borrowing and t4.used_pct == 0
    assert all(r.quota for name, r in rows.items() if name != "T4-16GB")
    api = {r["flavor_name"]: r for r in client_for("alice").get("/api/v1/usage/").json()}
    assert api["T4-16GB"] | {"tenant": 0} == {
        "tenant": 0,
        "tenant_slug": "team-alpha",
        "flavor_name": "T4-16GB",
        "used_milli": 1000,
        "guaranteed_milli": 0,
        "limit_milli": None,
        "borrowing": True,
        "quota": False,
    }
    browser = Client()
    browser.force_login(org.users["alice"])
    answer = browser.get(reverse("portal:tenant-detail", args=[org.alpha.pk]))
    assert answer.status_code == 200
    page = answer.content.decode()
    assert "T4-16GB" in page and "none of its own" in page and "all borrowed" in page
