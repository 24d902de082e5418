"""What-if runs are bounded (issue 34, item 7): one queued or running per person, an allowance
a day per scope, a 429 saying when to try again, and a time limit that ends a run failed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded
from django.db import IntegrityError
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from common.errors import RateLimitedError
from config.celery import app as celery_app
from tests.conftest import Org
from tests.whatif.builders import a_busy_past
from whatif import runs
from whatif import tasks as whatif_tasks
from whatif.models import WhatIf, WhatIfState

pytestmark = pytest.mark.django_db

URL = "/api/v1/what-ifs/"


def change(tenant: str = "team-bravo") -> dict[str, Any]:
    return {"kind": "quota", "tenant": tenant, "flavor": "H100-80GB", "weight": 2.0}


def body(org: Org, scope: str = "research") -> dict[str, Any]:
    tenant = "team-alpha" if scope == "alpha" else "team-bravo"
    return {"scope": getattr(org, scope).pk, "window_days": 1, "changes": [change(tenant)]}


def start(org: Org, who: str, now: Any, scope: str = "research") -> WhatIf:
    fields = body(org, scope)
    return runs.whatif_start(
        user=org.users[who],
        scope_id=fields["scope"],
        window_days=1,
        changes=fields["changes"],
        now=now,
    )


def test_a_second_run_waits_for_the_first_with_a_429(org: Org, client_for: Any) -> None:
    dana = client_for("dana")
    first = dana.post(URL, body(org), format="json")
    assert first.status_code == 201, first.content
    second = dana.post(URL, body(org, "alpha"), format="json")
    assert second.status_code == 429, second.content
    assert second["Retry-After"] == "30"
    assert f"#{first.json()['id']}" in second.json()["detail"]
    assert WhatIf.objects.count() == 1
    # Another person is not held by dana's run; dana is, once hers has finished.
    assert client_for("pat").post(URL, body(org), format="json").status_code == 201
    WhatIf.objects.filter(pk=first.json()["id"]).update(state=WhatIfState.DONE)
    assert dana.post(URL, body(org), format="json").status_code == 201


def test_two_active_runs_of_one_person_are_refused_by_the_table(org: Org) -> None:
    """Two starts at once both pass the check; the constraint takes one."""
    run = start(org, "dana", timezone.now())
    with pytest.raises(IntegrityError):
        WhatIf.objects.create(
            requested_by=run.requested_by,
            scope=run.scope,
            created_at=run.created_at,
            expires_at=run.expires_at,
        )


def test_the_daily_allowance_of_a_scope_says_when_the_next_run_may_start(
    org: Org, client_for: Any, settings: Any
) -> None:
    settings.GANTRY_WHATIF_RUNS_PER_DAY = 2
    t0 = timezone.now() - timedelta(hours=3)
    for who, at in (("dana", t0), ("pat", t0 + timedelta(hours=1))):
        WhatIf.objects.filter(pk=start(org, who, at).pk).update(state=WhatIfState.DONE)
    with pytest.raises(RateLimitedError) as refused:
        start(org, "dana", t0 + timedelta(hours=2))
    # the first leaves the 24 hours at t0 + 24 h: 22 hours (and a second) after now
    assert refused.value.retry_after_s == 22 * 3600 + 1
    assert "research's allowance of 2 what-if runs a day" in str(refused.value)
    answer = client_for("dana").post(URL, body(org), format="json")
    assert answer.status_code == 429
    assert 0 < int(answer["Retry-After"]) <= 21 * 3600 + 1
    assert "allowance" in answer.json()["detail"]
    assert WhatIf.objects.count() == 2
    # Another scope has its own allowance; the window slides past the first run.
    assert start(org, "dana", t0 + timedelta(hours=2), scope="alpha").scope == org.alpha
    WhatIf.objects.filter(scope=org.alpha).update(state=WhatIfState.DONE)
    assert start(org, "dana", t0 + timedelta(hours=24, seconds=1)).scope == org.research


# --- the time limit ---------------------------------------------------------------------------


@pytest.fixture
def past(org: Org) -> Org:
    a_busy_past(org, timezone.now())
    return org


def test_a_replay_past_its_time_limit_ends_failed(past: Org, settings: Any) -> None:
    """The progress writer checks the limit: a clock that jumps past it ends the replay (as
    on the embedded worker, whose thread pool has no Celery time limits)."""
    settings.GANTRY_WHATIF_TIME_LIMIT_S = 60
    now = timezone.now()
    run = start(past, "dana", now)
    ticks = iter([now] + [now + timedelta(seconds=61)] * 10)
    assert runs.whatif_run(run.pk, clock=lambda: next(ticks), every_cycles=1)
    run.refresh_from_db()
    assert run.state == WhatIfState.FAILED
    assert run.error == runs.time_limit_message()
    assert "time limit of 60 s" in run.error


def test_celerys_soft_time_limit_ends_the_run_failed(past: Org) -> None:
    """The soft limit's exception, raised where the replay reports progress."""
    now = timezone.now()
    run = start(past, "dana", now)

    class Limited(runs.ProgressWriter):
        def __call__(self, percent: int, stage: str) -> None:
            raise SoftTimeLimitExceeded()

    assert runs.whatif_run(run.pk, clock=lambda: now, writer=Limited(run.pk))
    run.refresh_from_db()
    assert (run.state, run.error) == (WhatIfState.FAILED, runs.time_limit_message())
    # Failed, it no longer holds its owner: the next run starts.
    assert start(past, "dana", now).state == WhatIfState.QUEUED


def test_a_run_whose_worker_was_killed_at_the_limit_is_failed_and_frees_its_owner(
    org: Org, settings: Any
) -> None:
    settings.GANTRY_WHATIF_TIME_LIMIT_S = 60
    now = timezone.now()
    run = start(org, "dana", now)
    WhatIf.objects.filter(pk=run.pk).update(state=WhatIfState.RUNNING, started_at=now)
    runs.whatifs_expire(now=now + timedelta(seconds=59) + runs.LIMIT_GRACE)
    run.refresh_from_db()
    assert run.state == WhatIfState.RUNNING  # not past the limit and its grace yet
    later = now + timedelta(seconds=61) + runs.LIMIT_GRACE
    assert start(org, "dana", later).state == WhatIfState.QUEUED  # the start fails it first
    run.refresh_from_db()
    assert (run.state, run.error) == (WhatIfState.FAILED, runs.time_limit_message())


def test_the_replay_runs_on_the_reports_queue_with_time_limits(settings: Any) -> None:
    route = celery_app.amqp.router.route({}, whatif_tasks.whatif_run.name)
    assert route["queue"].name == "reports"
    task = whatif_tasks.whatif_run
    assert task.soft_time_limit == settings.GANTRY_WHATIF_TIME_LIMIT_S
    assert task.time_limit > task.soft_time_limit


def test_the_portal_says_why_a_run_was_refused(org: Org) -> None:
    start(org, "dana", timezone.now())
    client = Client()
    client.force_login(org.users["dana"])
    form = {"scope": str(org.research.pk), "window_days": "1", "tenant": "team-bravo"}
    form |= {"flavor": "H100-80GB", "weight": "2"}
    answer = client.post(reverse("portal:whatif-new"), form)
    assert answer.status_code == 429
    assert "one at a time" in answer.content.decode()
    assert WhatIf.objects.count() == 1
