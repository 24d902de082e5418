"""What-if proposals that target a quota pinned to a cluster (issue 38): a quota change may
name a `cluster` (null or left out: the global quota); it is validated (a known cluster, a
guarantee and a limit only) and shown; replaying a pinned quota request proposes the pin.

The org fixture: research 32/64 H100 with team-alpha and team-bravo 16/32 each; dana
administers research, tina team-alpha.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from config.celery import app as celery_app
from scheduler.models import Cluster
from tenants.approvals import quota_request_create
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org
from tests.whatif.builders import a_busy_past
from whatif.models import WhatIf

URL = "/api/v1/what-ifs/"
BRAVO_ON_B = {
    "kind": "quota",
    "tenant": "team-bravo",
    "flavor": "H100-80GB",
    "cluster": "site-b",
    "guaranteed_milli": 4000,
    "limit_milli": 8000,
}


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def eager(django_capture_on_commit_callbacks: Any) -> Iterator[Any]:
    celery_app.conf.task_always_eager = True
    yield django_capture_on_commit_callbacks
    celery_app.conf.task_always_eager = False


@pytest.fixture
def past(org: Org) -> Org:
    Cluster.objects.create(name="site-b", backend="simulated")
    a_busy_past(org, timezone.now())
    return org


def start(client: Any, eager: Any, body: dict[str, Any]) -> Any:
    with eager(execute=True):
        return client.post(URL, body, format="json")


def test_a_pinned_proposal_is_replayed_and_shown_with_its_cluster(
    past: Org, client_for: Any, eager: Any
) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_ON_B]}
    created = start(client_for("dana"), eager, body)
    assert created.status_code == 201, created.json()
    run = client_for("dana").get(f"{URL}{created.json()['id']}/").json()
    assert run["state"] == "done", run["error"]
    assert run["changes"] == [BRAVO_ON_B]
    web = Client()
    web.force_login(past.users["dana"])
    page = web.get(reverse("portal:whatif-detail", args=[run["id"]])).content.decode()
    assert "team-bravo, H100-80GB on site-b:" in page


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"cluster": "site-z"}, "cluster", "unknown cluster 'site-z'."),
        ({"lend_limit_milli": 1000}, "lend_limit_milli", "sets guaranteed_milli and limit_milli"),
        ({"weight": 2.0}, "weight", "belongs to the global quota of H100-80GB"),
        ({"limit_milli": 2000}, "limit_milli", "below the guarantee"),
    ],
    ids=["unknown-cluster", "lending-on-a-pin", "weight-on-a-pin", "limit-below-guarantee"],
)
def test_a_bad_pinned_proposal_is_400_naming_the_field(
    past: Org, client_for: Any, eager: Any, change: dict[str, Any], field: str, message: str
) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [{**BRAVO_ON_B, **change}]}
    answer = start(client_for("dana"), eager, body)
    assert answer.status_code == 400, answer.json()
    assert message in " ".join(answer.json()["errors"][f"changes[0].{field}"])
    assert WhatIf.objects.count() == 0


def test_the_global_and_a_pinned_quota_are_two_settings(
    past: Org, client_for: Any, eager: Any
) -> None:
    glob = {k: v for k, v in BRAVO_ON_B.items() if k != "cluster"}
    body = {"scope": past.research.pk, "window_days": 1, "changes": [glob, BRAVO_ON_B]}
    assert start(client_for("dana"), eager, body).status_code == 201


def test_replaying_a_pinned_quota_request_proposes_the_pin(
    past: Org, client_for: Any, eager: Any
) -> None:
    request = quota_request_create(
        user=past.users["tina"],
        tenant=past.alpha,
        flavor=past.h100,
        values=QuotaValues(8000, 16000, None, 1.0),
        cluster=Cluster.objects.get(name="site-b"),
    )
    answer = start(client_for("dana"), eager, {"approval_request": request.pk, "window_days": 1})
    assert answer.status_code == 201, answer.json()
    assert answer.json()["changes"] == [
        {
            "kind": "quota",
            "tenant": "team-alpha",
            "flavor": "H100-80GB",
            "cluster": "site-b",
            "guaranteed_milli": 8000,
            "limit_milli": 16000,
        }
    ]
