"""The What-if pages: propose, follow, read side by side; the quota request's replay."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse
from django.utils import timezone

from config.celery import app as celery_app
from tenants.approvals import quota_request_create
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org
from tests.whatif.builders import a_busy_past
from whatif.models import WhatIf, WhatIfState

BRAVO_OFF = {
    "window_days": "1",
    "tenant": "team-bravo",
    "flavor": "H100-80GB",
    "guaranteed": "0",
    "limit": "0",
}


@pytest.fixture
def eager(django_capture_on_commit_callbacks: Any) -> Iterator[Any]:
    celery_app.conf.task_always_eager = True
    yield django_capture_on_commit_callbacks
    celery_app.conf.task_always_eager = False


@pytest.fixture
def past(org: Org) -> Org:
    a_busy_past(org, timezone.now())
    return org


def test_an_admin_proposes_and_reads_the_result_side_by_side(
    past: Org, web_for: Any, eager: Any
) -> None:
    dana = web_for("dana")
    page = dana.get(reverse("portal:whatifs")).content.decode()
    assert 'id="whatif-new"' in page and 'href="/what-ifs/"' in page  # the form, the nav link
    with eager(execute=True):
        answer = dana.post(reverse("portal:whatif-new"), {**BRAVO_OFF, "scope": past.research.pk})
    assert answer.status_code == 302
    run = WhatIf.objects.get()
    assert answer["Location"] == reverse("portal:whatif-detail", kwargs={"pk": run.pk})
    assert run.changes == [
        {
            "kind": "quota",
            "tenant": "team-bravo",
            "flavor": "H100-80GB",
            "guaranteed_milli": 0,
            "limit_milli": 0,
        }
    ]
    detail = dana.get(answer["Location"]).content.decode()
    # the change in words, each figure with its unit (a weight would have none)
    assert "<li>team-bravo, H100-80GB: guaranteed 0 GPUs, limit 0 GPUs</li>" in detail
    rows = re.findall(r'<tr><th scope="row">(.*?)</th>', detail)
    assert rows[-3:] == ["team-alpha", "team-bravo", "<em>others</em>"]
    assert "charlie" not in detail
    figure = json.loads(
        re.search(
            r'<script id="figure-whatif-waits" type="application/json">(.*?)</script>', detail, re.S
        ).group(1)
    )
    assert [bar["name"] for bar in figure["data"]] == [
        "mean wait, today",
        "mean wait, proposed",
        "p90 wait, today",
        "p90 wait, proposed",
    ]
    assert figure["data"][0]["x"] == ["team-alpha", "team-bravo", "others"]


def test_a_member_finds_no_what_if_page_nor_link(past: Org, web_for: Any) -> None:
    alice = web_for("alice")
    assert alice.get(reverse("portal:whatifs")).status_code == 404
    assert 'href="/what-ifs/"' not in alice.get(reverse("portal:home")).content.decode()


def test_a_bad_proposal_is_a_400_page_saying_why_and_starts_nothing(
    past: Org, web_for: Any, eager: Any
) -> None:
    body = {**BRAVO_OFF, "scope": past.research.pk, "tenant": "team-charlie"}
    with eager(execute=True):
        answer = web_for("dana").post(reverse("portal:whatif-new"), body)
    assert answer.status_code == 400
    assert "unknown tenant &#x27;team-charlie&#x27;" in answer.content.decode()
    assert WhatIf.objects.count() == 0


def test_the_progress_is_polled_until_the_run_is_over(past: Org, web_for: Any) -> None:
    from tests.whatif.builders import kept_run

    run = kept_run(past.users["pat"], past.research, ["team-alpha"])
    WhatIf.objects.filter(pk=run.pk).update(state=WhatIfState.RUNNING, progress=37, stage="day 3")
    url = reverse("portal:whatif-status", kwargs={"pk": run.pk})
    polled = web_for("dana").get(url, headers={"HX-Request": "true"})
    text = polled.content.decode()
    assert 'hx-trigger="every 2s"' in text and 'value="37"' in text and "day 3" in text
    assert "HX-Refresh" not in polled
    WhatIf.objects.filter(pk=run.pk).update(state=WhatIfState.DONE, progress=100)
    over = web_for("dana").get(url, headers={"HX-Request": "true"})
    assert over["HX-Refresh"] == "true" and "hx-trigger" not in over.content.decode()


def test_an_approver_replays_a_quota_request_from_the_inbox(
    past: Org, web_for: Any, eager: Any
) -> None:
    values = QuotaValues(
        guaranteed_milli=16_000, limit_milli=24_000, lend_limit_milli=None, weight=2
    )
    request = quota_request_create(
        user=past.users["tina"], tenant=past.alpha, flavor=past.h100, values=values
    )
    dana = web_for("dana")
    inbox = dana.get(reverse("portal:approvals")).content.decode()
    replay_url = reverse("portal:approval-whatif", kwargs={"pk": request.pk})
    assert f'action="{replay_url}"' in inbox and "Replay the effect" in inbox
    with eager(execute=True):
        answer = dana.post(replay_url)
    run = WhatIf.objects.get()
    assert answer["Location"] == reverse("portal:whatif-detail", kwargs={"pk": run.pk})
    assert (run.approval_id, run.state) == (request.pk, WhatIfState.DONE)
    inbox = dana.get(reverse("portal:approvals")).content.decode()
    assert f'href="/what-ifs/{run.pk}/"' in inbox and "Replay the effect" not in inbox
    # the requester cannot replay her own request; a member finds nothing
    assert web_for("tina").post(replay_url).status_code == 403
    assert web_for("alice").post(replay_url).status_code == 404
    assert WhatIf.objects.count() == 1
    # the history links the kept run for those who may see it, and for nobody else
    history = reverse("portal:approval-history")
    assert f'href="/what-ifs/{run.pk}/"' in dana.get(history).content.decode()
    for who in ("tina", "alice"):  # tina's runs are those of team-alpha's subtree only
        assert "/what-ifs/" not in web_for(who).get(history).content.decode().split("<main")[-1]
