"""The what-if API: the replay task's progress and results, scoping per persona, validation,
failures, and the link from a quota request."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from config.celery import app as celery_app
from tenants.approvals import quota_request_create
from tenants.models import Quota
from tenants.quotas.rules import QuotaValues
from tests.conftest import Org
from tests.whatif.builders import a_busy_past
from whatif import runs
from whatif.models import WhatIf, WhatIfState

URL = "/api/v1/what-ifs/"
BRAVO_OFF = {
    "kind": "quota",
    "tenant": "team-bravo",
    "flavor": "H100-80GB",
    "guaranteed_milli": 0,
    "limit_milli": 0,
}


@pytest.fixture
def eager(django_capture_on_commit_callbacks: Any) -> Iterator[Any]:
    """Tasks run where they are queued (after the commit), as the worker would run them."""
    celery_app.conf.task_always_eager = True
    yield django_capture_on_commit_callbacks
    celery_app.conf.task_always_eager = False


@pytest.fixture
def past(org: Org) -> Org:
    a_busy_past(org, timezone.now())
    return org


def start(client: Any, eager: Any, body: dict[str, Any]) -> Any:
    with eager(execute=True):
        return client.post(URL, body, format="json")


def test_a_replay_reports_both_sides_per_tenant(past: Org, client_for: Any, eager: Any) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    created = start(client_for("dana"), eager, body)
    assert created.status_code == 201, created.json()
    run = client_for("dana").get(f"{URL}{created.json()['id']}/").json()
    assert run["state"] == "done", run["error"]
    assert run["progress"] == {"percent": 100, "stage": "done"}
    results = run["results"]
    assert results["jobs_found"] == results["jobs_replayed"] == 4
    assert results["capped"] is False
    rows = {row["tenant"]: row for row in results["tenants"]}
    # bravo without quota never starts under the proposal; today it ran
    assert rows["team-bravo"]["baseline"]["started"] == 1
    assert rows["team-bravo"]["proposed"]["never_started"] == 1
    assert rows["team-bravo"]["proposed"]["mean_wait_s"] is None
    # alpha's second 8-GPU job waits an hour for the first (8 GPUs in all) on both sides
    assert rows["team-alpha"]["baseline"]["jobs"] == 2
    assert rows["team-alpha"]["baseline"]["p90_wait_s"] >= 3000
    for side in ("baseline", "proposed"):
        assert 0 < results["totals"][side]["utilization"] <= 1
        assert 0 < results["totals"][side]["fairness"] <= 1
    # 8 GPUs x 4 h + 4 GPUs x 1 h ran today; without bravo 8 GPU-hours fewer
    assert sum(r["baseline"]["gpu_hours"] for r in rows.values()) == pytest.approx(28)
    assert sum(r["proposed"]["gpu_hours"] for r in rows.values()) == pytest.approx(20)
    # utilization is over the whole window on both sides: GPU-hours / (8 GPUs x 24 h)
    assert results["totals"]["baseline"]["utilization"] == pytest.approx(28 / 192)
    assert results["totals"]["proposed"]["utilization"] == pytest.approx(20 / 192)


def test_a_tenant_admin_sees_other_tenants_only_as_others(
    past: Org, client_for: Any, eager: Any
) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    run_id = start(client_for("dana"), eager, body).json()["id"]
    seen_by_dana = client_for("dana").get(f"{URL}{run_id}/")
    tenants = [row["tenant"] for row in seen_by_dana.json()["results"]["tenants"]]
    assert tenants == ["team-alpha", "team-bravo", "others"]
    assert "charlie" not in seen_by_dana.content.decode()
    others = seen_by_dana.json()["results"]["tenants"][-1]
    assert others["baseline"]["jobs"] == 1  # team-charlie's job, unnamed
    seen_by_pat = client_for("pat").get(f"{URL}{run_id}/").json()
    assert [row["tenant"] for row in seen_by_pat["results"]["tenants"]] == [
        "team-alpha",
        "team-bravo",
        "team-charlie",
    ]


@pytest.mark.parametrize("who", ["alice", "bob-bravo", "chris"])
def test_members_get_404_on_the_whole_feature(
    past: Org, client_for: Any, eager: Any, who: str
) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    run_id = start(client_for("dana"), eager, body).json()["id"]
    client = client_for(who)
    assert client.get(URL).status_code == 404
    assert client.get(f"{URL}{run_id}/").status_code == 404
    assert start(client, eager, body).status_code == 404
    assert WhatIf.objects.count() == 1


def test_finance_reads_every_run_and_starts_none(past: Org, client_for: Any, eager: Any) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    run_id = start(client_for("dana"), eager, body).json()["id"]
    carol = client_for("carol")
    seen = carol.get(f"{URL}{run_id}/").json()
    assert "team-charlie" in [row["tenant"] for row in seen["results"]["tenants"]]
    assert start(carol, eager, {**body, "scope": None}).status_code == 403
    assert WhatIf.objects.count() == 1


def test_a_run_of_another_scope_is_404(past: Org, client_for: Any, eager: Any) -> None:
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    run_id = start(client_for("dana"), eager, body).json()["id"]
    tina = client_for("tina")  # admin of team-alpha, below research
    assert tina.get(f"{URL}{run_id}/").status_code == 404
    assert tina.get(URL).json()["results"] == []
    assert [r["id"] for r in client_for("pat").get(URL).json()["results"]] == [run_id]


@pytest.mark.parametrize(
    ("who", "change", "field", "message"),
    [
        # bravo is outside tina's subtree: the same answer as a tenant that does not exist
        ("tina", {**BRAVO_OFF}, "tenant", "unknown tenant 'team-bravo'."),
        ("tina", {**BRAVO_OFF, "tenant": "no-such-team"}, "tenant", "unknown tenant"),
        ("tina", {**BRAVO_OFF, "tenant": "team-alpha"}, "tenant", "you may not change"),
        ("dana", {**BRAVO_OFF, "tenant": "team-charlie"}, "tenant", "unknown tenant"),
        ("dana", {**BRAVO_OFF, "flavor": "B200"}, "flavor", "unknown flavor 'B200'."),
        ("dana", {**BRAVO_OFF, "limit_milli": 5, "guaranteed_milli": 10}, "limit_milli", "below"),
        ("dana", {**BRAVO_OFF, "user_limit_milli": 1000}, "user_limit_milli", "exceeds"),
        ("dana", {"kind": "priority_class", "name": "normal", "value": 7}, "name", "platform"),
        ("pat", {"kind": "priority_class", "name": "nope", "value": 7}, "name", "unknown"),
    ],
    ids=[
        "invisible-tenant",
        "no-such-tenant",
        "own-quota",
        "other-department",
        "unknown-flavor",
        "limit-below-guarantee",
        "user-cap-over-limit",
        "class-by-tenant-admin",
        "unknown-class",
    ],
)
def test_bad_proposals_are_400_naming_the_field_and_change_nothing(
    past: Org,
    client_for: Any,
    eager: Any,
    who: str,
    change: dict[str, Any],
    field: str,
    message: str,
) -> None:
    scope = {"tina": past.alpha.pk, "dana": past.research.pk, "pat": None}[who]
    body = {"scope": scope, "window_days": 1, "changes": [change]}
    answer = start(client_for(who), eager, body)
    assert answer.status_code == 400, answer.json()
    errors = answer.json()["errors"]
    assert message in " ".join(errors[f"changes[0].{field}"])
    assert WhatIf.objects.count() == 0


@pytest.mark.parametrize(
    "body",
    [
        {"window_days": 0, "changes": [BRAVO_OFF]},
        {"window_days": 91, "changes": [BRAVO_OFF]},
        {"changes": []},
        {"changes": [{"kind": "quota", "tenant": "team-bravo"}]},
        {"changes": [{**BRAVO_OFF, "value": 3}]},
        {"changes": [BRAVO_OFF], "surprise": 1},
    ],
    ids=["window-0", "window-91", "no-changes", "no-flavor", "foreign-field", "unknown-field"],
)
def test_malformed_bodies_are_400_and_change_nothing(
    past: Org, client_for: Any, eager: Any, body: dict[str, Any]
) -> None:
    answer = start(client_for("dana"), eager, {"scope": past.research.pk, **body})
    assert answer.status_code == 400
    assert answer.json()["errors"]
    assert WhatIf.objects.count() == 0


def test_a_weight_a_quota_cannot_take_is_refused_as_setting_the_quota_is(
    past: Org, client_for: Any, eager: Any
) -> None:
    # was a 201: the what-if took weights up to 99999, PATCH /quotas/ up to 10000, so it
    # proposed a setting that could never be made
    dana = client_for("dana")
    quota = Quota.objects.get(tenant=past.bravo, flavor=past.h100, cluster=None)
    for weight, status in [(50000, 400), (10000.5, 400), (0.0001, 400), (10000, 201)]:
        change = {"kind": "quota", "tenant": "team-bravo", "flavor": "H100-80GB", "weight": weight}
        body = {"scope": past.research.pk, "window_days": 1, "changes": [change]}
        proposed = start(dana, eager, body)
        patched = dana.patch(f"/api/v1/quotas/{quota.pk}/", {"weight": weight}, format="json")
        assert (proposed.status_code, patched.status_code) == (
            status,
            200 if status == 201 else 400,
        )
        if status == 400:
            errors = proposed.json()["errors"]["changes"]["0"]["weight"]
            assert errors == patched.json()["errors"]["weight"]
    assert WhatIf.objects.count() == 1


def test_the_schema_bounds_a_proposed_weight_as_the_quotas_own() -> None:
    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    quota = schemas["PatchedQuotaValuesInRequest"]["properties"]["weight"]
    proposal = schemas["WhatIfInRequest"]["properties"]["changes"]["items"]["oneOf"][0]
    weight = proposal["properties"]["weight"]
    assert (weight["minimum"], weight["maximum"]) == (quota["minimum"], quota["maximum"])


def test_a_tenant_admin_scopes_only_to_a_tenant_they_administer(
    past: Org, client_for: Any, eager: Any
) -> None:
    for scope in (past.product.pk, None, 999_999):
        body = {"scope": scope, "window_days": 1, "changes": [BRAVO_OFF]}
        answer = start(client_for("dana"), eager, body)
        assert answer.status_code == 400
        assert "scope" in answer.json()["errors"]
    assert WhatIf.objects.count() == 0


def test_progress_is_written_while_it_replays(past: Org, client_for: Any) -> None:
    now = timezone.now()
    run = runs.whatif_start(
        user=past.users["pat"], scope_id=None, window_days=1, changes=[BRAVO_OFF], now=now
    )
    seen: list[tuple[int, str, str]] = []

    class Watching(runs.ProgressWriter):
        def __call__(self, percent: int, stage: str) -> None:
            super().__call__(percent, stage)
            row = WhatIf.objects.get(pk=run.pk)
            seen.append((row.progress, row.state, row.stage))

    assert runs.whatif_run(run.pk, clock=lambda: now, every_cycles=1, writer=Watching(run.pk))
    percents = [p for p, _, _ in seen]
    assert percents == sorted(percents)
    assert percents[0] == 0 and any(0 < p < 50 for p in percents)
    assert any(50 <= p < 100 for p in percents)  # the second side
    assert {state for _, state, _ in seen} == {"running"}
    assert any("proposed settings" in stage for _, _, stage in seen)
    run.refresh_from_db()
    assert (run.state, run.progress) == (WhatIfState.DONE, 100)
    # a second delivery of the task finds it claimed and does nothing
    assert runs.whatif_run(run.pk, clock=lambda: now) is False


def test_a_failing_replay_marks_the_run_failed_with_the_error(
    past: Org, client_for: Any, eager: Any, monkeypatch: Any
) -> None:
    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("the cluster could not be read")

    monkeypatch.setattr(runs, "replay", broken)
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    run = client_for("dana").get(f"{URL}{start(client_for('dana'), eager, body).json()['id']}/")
    assert run.json()["state"] == "failed"
    assert "the cluster could not be read" in run.json()["error"]
    assert run.json()["results"] is None


def test_the_replay_is_capped_and_says_so(
    past: Org, client_for: Any, eager: Any, settings: Any
) -> None:
    settings.GANTRY_WHATIF_MAX_JOBS = 3
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    results = client_for("dana").get(f"{URL}{start(client_for('dana'), eager, body).json()['id']}/")
    found = results.json()["results"]
    assert (found["capped"], found["jobs_found"], found["jobs_replayed"]) == (True, 4, 3)


def test_jobs_older_than_the_window_are_not_replayed(
    past: Org, client_for: Any, eager: Any
) -> None:
    from tests.whatif.builders import eight_gpu_node, ran

    ran(
        past,
        past.proj_alpha,
        at=timezone.now() - timedelta(days=3),
        hours=1,
        gpus=8,
        node=eight_gpu_node("h100-b"),
    )
    body = {"scope": past.research.pk, "window_days": 1, "changes": [BRAVO_OFF]}
    run = client_for("dana").get(f"{URL}{start(client_for('dana'), eager, body).json()['id']}/")
    assert run.json()["results"]["jobs_found"] == 4


def quota_request(org: Org) -> Any:
    values = QuotaValues(
        guaranteed_milli=16_000,
        limit_milli=24_000,
        lend_limit_milli=None,
        weight=2,
        user_limit_milli=8_000,
    )
    return quota_request_create(
        user=org.users["tina"], tenant=org.alpha, flavor=org.h100, values=values
    )


def test_a_quota_request_is_replayed_for_its_approver_and_kept(
    past: Org, client_for: Any, eager: Any
) -> None:
    request = quota_request(past)
    dana = client_for("dana")
    first = start(dana, eager, {"approval_request": request.pk, "window_days": 2})
    assert first.status_code == 201, first.json()
    run = first.json()
    assert run["approval_request"] == request.pk
    assert run["scope"] == "research"
    assert run["changes"] == [
        {
            "kind": "quota",
            "tenant": "team-alpha",
            "flavor": "H100-80GB",
            "guaranteed_milli": 16_000,
            "limit_milli": 24_000,
            "lend_limit_milli": None,
            "user_limit_milli": 8_000,
            "weight": 2.0,
        }
    ]
    assert dana.get(f"{URL}{run['id']}/").json()["state"] == "done"
    # asked again, the kept run is the answer
    again = start(dana, eager, {"approval_request": request.pk})
    assert again.json()["id"] == run["id"]
    assert WhatIf.objects.count() == 1


@pytest.mark.parametrize("who", ["tina", "bob-bravo"])
def test_only_a_quota_requests_deciders_replay_it(
    past: Org, client_for: Any, eager: Any, who: str
) -> None:
    request = quota_request(past)
    answer = start(client_for(who), eager, {"approval_request": request.pk})
    assert answer.status_code in (400, 404)
    if who == "tina":  # the requester: an admin, but she does not decide her own request
        assert "approval_request" in answer.json()["errors"]
    assert WhatIf.objects.count() == 0
