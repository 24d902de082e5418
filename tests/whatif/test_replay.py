"""How a what-if rebuilds the window's jobs and the organisation from the database."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduler.models import Job, JobState
from tests import factories as f
from tests.conftest import Org
from tests.whatif.builders import eight_gpu_node, kept_run, ran
from whatif import replay, runs
from whatif.models import WhatIf

DAY = 86_400.0


def by_name(work: replay.Workload) -> dict[str, Any]:
    names = dict(Job.objects.values_list("pk", "name"))
    return {names[int(w.request.id)]: w for w in work.jobs}


def test_the_window_holds_what_ran_and_waits_in_it(org: Org) -> None:
    now = timezone.now()
    start = now - timedelta(days=1)
    node = eight_gpu_node()
    # ran an hour, queued 10 h before now: arrives at 14 h into the window
    hour = ran(org, org.proj_alpha, at=now - timedelta(hours=10), hours=1, gpus=8, node=node)
    Job.objects.filter(pk=hour.pk).update(name="an-hour")
    # still running since before the window opened: arrives at its start, runs all of it
    old = f.JobFactory(
        project=org.proj_bravo,
        name="since-before",
        state=JobState.RUNNING,
        queued_at=now - timedelta(days=3),
        started_at=now - timedelta(days=3),
    )
    f.AllocationFactory(job=old, node=node, started_at=now - timedelta(days=3))
    # waiting now: runs for its max runtime
    f.JobFactory(
        project=org.proj_alpha,
        name="waiting",
        queued_at=now - timedelta(hours=1),
        max_runtime_s=7200,
    )
    # preempted after an hour, then ran 30 minutes to the end: the last attempt counts
    twice = f.JobFactory(
        project=org.proj_alpha,
        name="twice",
        state=JobState.SUCCEEDED,
        attempt=1,
        queued_at=now - timedelta(hours=5),
    )
    t0 = now - timedelta(hours=5)
    f.AllocationFactory(
        job=twice, node=node, attempt=0, started_at=t0, ended_at=t0 + timedelta(hours=1)
    )
    f.AllocationFactory(
        job=twice,
        node=node,
        attempt=1,
        started_at=t0 + timedelta(hours=2),
        ended_at=t0 + timedelta(hours=2, minutes=30),
    )
    # left out: waiting for approval, rejected, cancelled before it started, and too old
    for name, state in [
        ("asks", JobState.PENDING_APPROVAL),
        ("refused", JobState.REJECTED),
        ("withdrawn", JobState.CANCELLED),
    ]:
        f.JobFactory(
            project=org.proj_alpha, name=name, state=state, queued_at=now - timedelta(hours=2)
        )
    ran(org, org.proj_alpha, at=now - timedelta(days=2), hours=1, gpus=8, node=node)

    work = replay.workload(start, now)
    jobs = by_name(work)
    assert sorted(jobs) == ["an-hour", "since-before", "twice", "waiting"]
    assert work.found == len(work.jobs) == 4
    assert work.horizon_s == pytest.approx(DAY)
    assert (jobs["since-before"].arrival_s, jobs["since-before"].duration_s) == (
        0.0,
        pytest.approx(DAY),
    )
    assert jobs["since-before"].request.tenant == "team-bravo"
    assert jobs["waiting"].duration_s == 7200
    assert jobs["waiting"].arrival_s == pytest.approx(DAY - 3600)
    assert jobs["twice"].duration_s == pytest.approx(1800)
    assert jobs["twice"].request.attempt == 0  # the replay makes its own attempts
    assert jobs["an-hour"].arrival_s == pytest.approx(DAY - 36_000)
    assert jobs["an-hour"].duration_s == pytest.approx(3600)
    assert jobs["an-hour"].request.resources.gpu_milli == 8000


def test_changes_apply_over_todays_organisation(org: Org) -> None:
    f.QuotaFactory(tenant=org.alpha, flavor=org.a100, guaranteed_milli=0, limit_milli=0, weight=1)
    rows = replay._organisation_rows()
    changes = [
        {"kind": "quota", "tenant": "team-alpha", "flavor": "A100-40GB", "weight": 3.0},
        {"kind": "quota", "tenant": "team-charlie", "flavor": "A100-40GB", "limit_milli": 4000},
        {
            "kind": "quota",
            "tenant": "team-bravo",
            "flavor": "H100-80GB",
            "guaranteed_milli": 8000,
            "user_limit_milli": 4000,
        },
        {"kind": "priority_class", "name": "low", "value": 999},
    ]
    today, classes_today = replay.organisation(rows, [])
    proposed, classes = replay.organisation(rows, changes)
    tenants = {t.name: t for t in proposed}
    before = {t.name: t for t in today}
    assert before["team-alpha"].weight == 1.0
    assert tenants["team-alpha"].weight == 3.0  # the largest of its quotas' weights
    assert tenants["team-charlie"].quotas["A100-40GB"].limit == 4000  # a new quota from zero
    assert tenants["team-charlie"].quotas["A100-40GB"].guaranteed == 0
    # the fields a change leaves out keep today's values
    assert tenants["team-bravo"].quotas["H100-80GB"].guaranteed == 8000
    assert (
        tenants["team-bravo"].quotas["H100-80GB"].limit
        == before["team-bravo"].quotas["H100-80GB"].limit
    )
    assert {c.name: c.value for c in classes}["low"] == 999
    assert tenants["team-bravo"].user_caps == {"H100-80GB": 4000}  # one user's cap
    assert before["team-bravo"].user_caps == {}
    assert {c.name: c.value for c in classes_today}["low"] != 999


def test_expired_runs_are_deleted_and_kept_ones_stay(org: Org) -> None:
    old = kept_run(org.users["pat"], org.research, ["team-alpha"])
    kept = kept_run(org.users["pat"], org.research, ["team-alpha"])
    WhatIf.objects.filter(pk=old.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert runs.whatifs_expire(now=timezone.now()) == 1
    assert list(WhatIf.objects.values_list("pk", flat=True)) == [kept.pk]


def test_the_list_reads_a_fixed_number_of_queries(
    org: Org, client_for: Any, django_assert_max_num_queries: Any
) -> None:
    for _ in range(12):
        kept_run(org.users["pat"], org.research, ["team-alpha", "team-bravo"])
    client = client_for("dana")
    with django_assert_max_num_queries(6):
        listed = client.get("/api/v1/what-ifs/")
    assert listed.json()["count"] == 12


def test_the_list_filters_by_state_scope_and_quota_request(org: Org, client_for: Any) -> None:
    running = kept_run(org.users["pat"], org.alpha, ["team-alpha"])
    WhatIf.objects.filter(pk=running.pk).update(state="running")
    done = kept_run(org.users["pat"], org.research, ["team-alpha"])
    dana = client_for("dana")

    def ids(query: str) -> list[int]:
        return [r["id"] for r in dana.get(f"/api/v1/what-ifs/{query}").json()["results"]]

    assert ids("?state=running") == [running.pk]
    assert ids(f"?scope={org.research.pk}") == [done.pk]
    assert ids(f"?scope={org.charlie.pk}") == []  # not hers: the same empty page as none
    assert ids("?approval=1") == []
    assert dana.get("/api/v1/what-ifs/?state=lost").status_code == 400


def test_runs_left_queued_or_running_by_a_lost_worker_end_failed(org: Org) -> None:
    now = timezone.now()
    runs_by_state = {}
    # Three people's: one run queued or running per person.
    for who, state, hours in [("pat", "running", 7), ("dana", "queued", 7), ("tina", "running", 1)]:
        run = kept_run(org.users[who], org.research, ["team-alpha"])
        WhatIf.objects.filter(pk=run.pk).update(
            state=state, results=None, created_at=now - timedelta(hours=hours)
        )
        runs_by_state[(state, hours)] = run.pk
    runs.whatifs_expire(now=now)
    states = dict(WhatIf.objects.values_list("pk", "state"))
    assert states[runs_by_state[("running", 7)]] == "failed"
    assert states[runs_by_state[("queued", 7)]] == "failed"
    assert states[runs_by_state[("running", 1)]] == "running"  # may still be replaying
    failed = WhatIf.objects.get(pk=runs_by_state[("running", 7)])
    assert "start it again" in failed.error
    assert failed.expires_at > now  # kept for its owner to read why
