"""Mass assignment, per endpoint: every API write refuses a field its caller must not set.

For every route and method that writes (POST, PUT, PATCH), found from the URL configuration,
WRITES holds a caller allowed to write there and a valid body. The fields tried on top of it
come from the served OpenAPI schema: every field the answer shows that the request does not
take (ids, states, owners, timestamps, tenants and parents that cannot move...), the names a
privilege grab would try (SMUGGLED), and an unknown name. The project's rule, everywhere (the
strict input of common/api/serializers.py): a 400 naming the field, and nothing stored changes.
The valid body alone is then accepted, so a 400 comes from the field and not from the body.

A route without an entry fails `test_every_write_route_has_an_entry`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from typing import Any

import pytest
from django.apps import apps
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from billing.models import Budget
from scheduler.jobs.services import job_submit
from scheduler.models import Cluster, GpuDevice, Job, Node
from tenants import approval_policies
from tenants.models import ApprovalRequest, Membership, PriorityClass, Quota, Tenant
from tests import factories as f
from tests.api.test_isolation_walk import api_routes, populate, populate_billing
from tests.billing.builders import T0, at
from tests.conftest import Org, job_spec

WRITE_METHODS = ("POST", "PUT", "PATCH")
# Names a caller would try to grab a row or a privilege with, whatever the endpoint.
SMUGGLED = (
    "id",
    "pk",
    "state",
    "tenant",
    "parent",
    "path",
    "organisation",
    "owner",
    "user",
    "created_by",
    "submitted_by",
    "requester",
    "decided_by",
    "approved",
    "is_staff",
    "is_superuser",
    "role",
    "created_at",
    "updated_at",
    "cost",
    "charged",
    "allocations",
    "gantry_unknown_field",
)


@dataclass(frozen=True)
class Write:
    """A caller allowed to write on the route, the URL and a body it accepts."""

    persona: str
    make: Callable[[Org], tuple[str, dict[str, Any]]]  # -> (url, valid body)
    ok: tuple[int, ...] = (200, 201)
    clock: Callable[[pytest.MonkeyPatch], None] | None = None  # pins what "now" is


def _month_metered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The month closed is the metered window of populate_billing, closed after it."""
    from billing.api import costs

    monkeypatch.setattr(costs, "month_bounds", lambda text: (T0, at(2)))
    monkeypatch.setattr(timezone, "now", lambda: at(3))


def _login_unthrottled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refused body is an attempt at the token endpoint: its rate limit (20 a minute per
    address, tests/api/test_token_login.py) out of the way."""
    from common.api.throttles import LoginThrottle

    monkeypatch.setattr(LoginThrottle, "get_rate", lambda self: "100000/min")


def _pending_request(org: Org) -> ApprovalRequest:
    """A job of alice's that waits for team-alpha's approval."""
    approval_policies.policy_set(
        user=org.users["pat"], tenant=org.alpha, rule="gpus_over", threshold=2
    )
    job, _ = job_submit(user=org.users["alice"], project=org.proj_alpha, payload=job_spec())
    return ApprovalRequest.objects.get(subject_id=job.pk, kind="job")


def _policy(org: Org) -> int:
    # tina's own policy: a policy set from above her is not hers to change.
    policy = approval_policies.policy_set(
        user=org.users["tina"], tenant=org.alpha, rule="gpus_over", threshold=8
    )
    return int(policy.pk)


def _quota_request(org: Org) -> int:
    """tina's request for more quota for team-alpha, waiting for research's admins."""
    response = client_as(org, "tina").post(
        "/api/v1/quota-requests/",
        {"tenant": org.alpha.pk, "flavor": org.h100.pk, **QUOTA},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return int(response.json()["id"])


TCO = {
    "purchase_price": "24000",
    "depreciation_months": 36,
    "power_cooling_per_gpu_hour": "0.2",
    "hosting_support_per_month": "100",
    "on_demand_per_gpu_hour": "2.5",
    "committed_per_gpu_hour": "1.8",
}


def _tco(org: Org) -> Any:
    from capacity.services import tco_inputs_set

    values = {k: (v if isinstance(v, int) else Decimal(v)) for k, v in TCO.items()}
    return tco_inputs_set(user=org.users["carol"], flavor=org.h100, values=values)


def _suggestion(org: Org) -> int:
    """A pending rate suggestion for H100s, from finance's TCO inputs."""
    from capacity.services import rate_suggestion_create

    _tco(org)
    suggestion = rate_suggestion_create(
        user=org.users["carol"], flavor=org.h100, target_utilization="0.8"
    )
    return int(suggestion.pk)


def _forecast_and_node(org: Org) -> None:
    """A stored forecast of H100s and a node of them to copy (an expansion's needs)."""
    from tests.capacity.builders import stored_run

    stored_run(org)
    _node(org)


def client_as(org: Org, persona: str) -> APIClient:
    client = APIClient()
    client.force_authenticate(org.users[persona])
    return client


def _webhook(tenant: Tenant) -> Tenant:
    tenant.webhook_url = "https://hooks.example.com/gantry"
    tenant.save(update_fields=["webhook_url"])
    return tenant


def _node(org: Org) -> Node:
    node = f.NodeFactory(name="n-mass")
    GpuDevice.objects.create(
        node=node, index=0, uuid="GPU-n-mass-0", model="H100-80GB", memory_mib=81920
    )
    return node


def _closed_statement(org: Org) -> Any:
    populate(org)
    return populate_billing(org)


def _proposal(org: Org) -> tuple[str, dict[str, Any]]:
    """A pending adjustment proposal on the closed statement (billing/metering/late.py)."""
    from billing.models import AdjustmentProposal
    from scheduler.models import Allocation

    statement = _closed_statement(org)
    allocation = Allocation.objects.filter(job__project=org.proj_alpha).first()
    assert allocation is not None
    proposal = AdjustmentProposal.objects.create(
        statement=statement,
        allocation=allocation,
        tenant=org.alpha,
        project=org.proj_alpha,
        amount=Decimal("1.00"),
        reason="usage recorded late",
        created_at=at(5),
    )
    return f"/api/v1/statements/{statement.pk}/accept-proposal/", {"proposal": proposal.pk}


def _cluster(org: Org) -> Cluster:
    return Cluster.objects.create(name="site-mass", backend="simulated")


def _job(org: Org) -> Job:
    return f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])


QUOTA = {"guaranteed_milli": 16000, "limit_milli": 32000}
WINDOW = {"from": "2031-01-31T20:00:00Z", "to": "2031-02-01T00:00:00Z"}

# route name and method -> the write. Creates name their own tenant (the tenant they create in
# is theirs to choose); every other field the answer shows is the server's.
WRITES: dict[tuple[str, str], Write] = {
    ("tenant-list", "POST"): Write(
        "dana",
        lambda o: ("/api/v1/tenants/", {"parent": o.research.pk, "slug": "t-new", "name": "N"}),
    ),
    ("tenant-detail", "PATCH"): Write(
        "tina", lambda o: (f"/api/v1/tenants/{o.alpha.pk}/", {"name": "Alpha"})
    ),
    ("tenant-idlerule", "PUT"): Write(
        "tina",
        lambda o: (
            f"/api/v1/tenants/{o.alpha.pk}/idle-rule/",
            {"threshold_pct": 5, "duration_minutes": 30, "action": "notify"},
        ),
    ),
    ("tenant-webhooktest", "POST"): Write(
        "tina", lambda o: (f"/api/v1/tenants/{_webhook(o.alpha).pk}/webhook/test/", {}), ok=(202,)
    ),
    ("tenant-webhooksecret", "POST"): Write(
        "tina", lambda o: (f"/api/v1/tenants/{_webhook(o.alpha).pk}/webhook/secret/", {})
    ),
    ("tenant-registries", "PUT"): Write(
        "dana",
        lambda o: (
            f"/api/v1/tenants/{o.alpha.pk}/registries/",
            {"allowed_registries": ["registry.example.com"]},
        ),
    ),
    ("project-list", "POST"): Write(
        "tina",
        lambda o: ("/api/v1/projects/", {"tenant": o.alpha.pk, "slug": "p-new", "name": "N"}),
    ),
    ("project-detail", "PATCH"): Write(
        "tina", lambda o: (f"/api/v1/projects/{o.proj_alpha.pk}/", {"name": "Renamed"})
    ),
    ("membership-list", "POST"): Write(
        "tina",
        lambda o: (
            "/api/v1/memberships/",
            {"tenant": o.alpha.pk, "username": "chris", "role": "member"},
        ),
    ),
    ("membership-detail", "PATCH"): Write(
        "tina",
        lambda o: (
            f"/api/v1/memberships/{Membership.objects.get(user=o.users['alice']).pk}/",
            {"role": "approver"},
        ),
    ),
    ("flavor-list", "POST"): Write(
        "pat", lambda o: ("/api/v1/flavors/", {"name": "L4-24GB", "memory_mib": 24576})
    ),
    ("flavor-detail", "PATCH"): Write(
        "pat", lambda o: (f"/api/v1/flavors/{o.a100.pk}/", {"memory_mib": 40000})
    ),
    ("quota-list", "POST"): Write(
        "dana",
        lambda o: (
            "/api/v1/quotas/",
            {"tenant": o.alpha.pk, "flavor": o.a100.pk, "guaranteed_milli": 0, "limit_milli": 0},
        ),
    ),
    ("quota-detail", "PATCH"): Write(
        "dana",
        lambda o: (
            f"/api/v1/quotas/{Quota.objects.get(tenant=o.alpha, flavor=o.h100).pk}/",
            {"limit_milli": 20000},
        ),
    ),
    ("priorityclass-list", "POST"): Write(
        "pat", lambda o: ("/api/v1/priority-classes/", {"name": "urgent", "value": 5000})
    ),
    ("priorityclass-detail", "PATCH"): Write(
        "pat",
        lambda o: (
            f"/api/v1/priority-classes/{PriorityClass.objects.get(name='low').pk}/",
            {"value": 11},
        ),
    ),
    ("prioritydefault-list", "POST"): Write(
        "tina",
        lambda o: (
            "/api/v1/priority-defaults/",
            {"tenant": o.alpha.pk, "job_type": "training", "priority_class": "normal"},
        ),
    ),
    ("approvalpolicy-list", "POST"): Write(
        "tina",
        lambda o: (
            "/api/v1/approval-policies/",
            {"tenant": o.alpha.pk, "rule": "gpus_over", "threshold": 1},
        ),
    ),
    ("approvalpolicy-detail", "PATCH"): Write(
        "tina",
        lambda o: (f"/api/v1/approval-policies/{_policy(o)}/", {"threshold": 4}),
    ),
    ("quotarequest-list", "POST"): Write(
        "tina",
        lambda o: (
            "/api/v1/quota-requests/",
            {"tenant": o.alpha.pk, "flavor": o.h100.pk, **QUOTA},
        ),
    ),
    ("job-list", "POST"): Write(
        "alice", lambda o: ("/api/v1/jobs/", {"project": o.proj_alpha.pk, "spec": job_spec()})
    ),
    ("job-cancel", "POST"): Write(
        "alice", lambda o: (f"/api/v1/jobs/{_job(o).pk}/cancel/", {"reason": "not needed"})
    ),
    ("node-report", "POST"): Write(
        "pat",
        lambda o: (
            "/api/v1/nodes/report/",
            {"node": _node(o).name, "driver_version": "550.54.15", "gpus": []},
        ),
    ),
    **{
        (f"node-{action}", "POST"): Write(
            "pat",
            lambda o, action=action: (
                f"/api/v1/nodes/{_node(o).pk}/{action}/",
                {"reason": "maintenance"},
            ),
        )
        for action in ["cordon", "drain", "fail", "heal", "uncordon"]
    },
    ("cluster-list", "POST"): Write(
        "pat",
        lambda o: ("/api/v1/clusters/", {"name": "site-b", "backend": "simulated"}),
    ),
    ("cluster-detail", "PATCH"): Write(
        "pat",
        lambda o: (f"/api/v1/clusters/{_cluster(o).pk}/", {"labels": {"region": "eu"}}),
    ),
    **{
        (f"cluster-{action}", "POST"): Write(
            "pat", lambda o, action=action: (f"/api/v1/clusters/{_cluster(o).pk}/{action}/", {})
        )
        for action in ["cordon", "uncordon"]
    },
    ("approvalrequest-approve", "POST"): Write(
        "tina",
        lambda o: (
            f"/api/v1/approval-requests/{_pending_request(o).pk}/approve/",
            {"comment": "ok"},
        ),
    ),
    ("approvalrequest-reject", "POST"): Write(
        "tina",
        lambda o: (
            f"/api/v1/approval-requests/{_pending_request(o).pk}/reject/",
            {"comment": "no"},
        ),
    ),
    ("approvalrequest-withdraw", "POST"): Write(
        "tina", lambda o: (f"/api/v1/approval-requests/{_quota_request(o)}/withdraw/", {})
    ),
    ("quote", "POST"): Write(
        "alice", lambda o: ("/api/v1/quotes/", {"project": o.proj_alpha.pk, "spec": job_spec()})
    ),
    ("ratecard-list", "POST"): Write(
        "pat",
        lambda o: (
            "/api/v1/rate-cards/",
            {"flavor": o.h100.pk, "valid_from": "2031-01-01T00:00:00Z", "gpu_hour": "9"},
        ),
    ),
    ("budget-list", "POST"): Write(
        "carol",
        lambda o: (
            "/api/v1/budgets/",
            {"tenant": o.alpha.pk, "month": "2031-02-01", "limit": "10"},
        ),
    ),
    ("budget-detail", "PATCH"): Write(
        "carol",
        lambda o: (f"/api/v1/budgets/{_budget(o)}/", {"limit": "20"}),
    ),
    ("statement-close", "POST"): Write(
        "pat",
        lambda o: (
            "/api/v1/statements/close/",
            {"organisation": _closed_statement(o).organisation_id, "month": "2031-01"},
        ),
        clock=_month_metered,
    ),
    ("statement-adjust", "POST"): Write(
        "pat",
        lambda o: (
            f"/api/v1/statements/{_closed_statement(o).pk}/adjust/",
            {"tenant": o.charlie.pk, "amount": "-2.00", "reason": "a faulty node"},
        ),
    ),
    ("statement-accept", "POST"): Write("carol", _proposal),
    ("billingpolicy-detail", "PUT"): Write(
        "pat", lambda o: (f"/api/v1/billing-policies/{o.acme.pk}/", {"idle_policy": "spread"})
    ),
    ("costexport-list", "POST"): Write(
        "alice", lambda o: ("/api/v1/cost-exports/", {**WINDOW, "format": "csv"})
    ),
    ("whatif-list", "POST"): Write(
        "dana",
        lambda o: (
            "/api/v1/what-ifs/",
            {
                "scope": o.alpha.pk,
                "changes": [
                    {"kind": "quota", "tenant": "team-alpha", "flavor": "H100-80GB", "weight": 2}
                ],
            },
        ),
    ),
    ("pooltarget-list", "POST"): Write(
        "pat",
        lambda o: ("/api/v1/capacity/targets/", {"flavor": o.h100.pk, "target_utilization": "0.7"}),
    ),
    ("tcoinputs-list", "POST"): Write(
        "carol", lambda o: ("/api/v1/capacity/tco-inputs/", {"flavor": o.h100.pk, **TCO})
    ),
    ("ratesuggestion-list", "POST"): Write(
        "carol",
        lambda o: (
            "/api/v1/capacity/rate-suggestions/",
            {"flavor": _tco(o).flavor_id, "target_utilization": "0.8"},
        ),
    ),
    ("ratesuggestion-accept", "POST"): Write(
        "pat", lambda o: (f"/api/v1/capacity/rate-suggestions/{_suggestion(o)}/accept/", {})
    ),
    ("ratesuggestion-reject", "POST"): Write(
        "carol",
        lambda o: (f"/api/v1/capacity/rate-suggestions/{_suggestion(o)}/reject/", {"reason": "no"}),
    ),
    ("capacity-expansions", "POST"): Write(
        "pat",
        lambda o: (
            "/api/v1/capacity/expansions/",
            _forecast_and_node(o) or {"flavor": "H100-80GB", "action": "add", "gpus": 8},
        ),
    ),
    ("api-token", "POST"): Write(
        "anonymous",
        lambda o: ("/api/v1/auth/token/", {"username": "alice", "password": "pw"}),
        clock=lambda monkeypatch: _login_unthrottled(monkeypatch),
    ),
    # A session has no token to rotate (403); rotation itself: tests/api/test_token_expiry.py.
    ("api-token-rotate", "POST"): Write(
        "alice", lambda o: ("/api/v1/auth/token/rotate/", {}), ok=(403,)
    ),
}


def _budget(org: Org) -> int:
    budget = Budget.objects.create(
        tenant=org.alpha, month=T0.replace(day=1, hour=0), limit=Decimal(100)
    )
    return budget.pk


def write_routes() -> list[tuple[str, str]]:
    return sorted(
        (route.name, method)
        for route in api_routes()
        for method in route.methods
        if method in WRITE_METHODS
    )


@cache
def served_schema() -> dict[str, Any]:
    return dict(SchemaGenerator().get_schema(request=None, public=True))


def _properties(component: dict[str, Any] | None) -> dict[str, Any]:
    if not component or "$ref" not in component:
        return {}
    name = component["$ref"].rsplit("/", 1)[1]
    return dict(served_schema()["components"]["schemas"][name].get("properties", {}))


def _content(part: dict[str, Any]) -> dict[str, Any] | None:
    return part.get("content", {}).get("application/json", {}).get("schema")


def forbidden_fields(url: str, method: str) -> list[str]:
    """What the answer shows and the request does not take, and SMUGGLED, per the schema."""
    schema = served_schema()
    # the most literal template that matches: nodes/report/ before nodes/{id}/
    path = min((p for p in schema["paths"] if _matches(p, url)), key=lambda p: p.count("{"))
    operation = schema["paths"][path][method.lower()]
    accepted = set(_properties(_content(operation.get("requestBody", {}))))
    shown: set[str] = set()
    for code in ("200", "201"):
        shown |= set(_properties(_content(operation["responses"].get(code, {}))))
    return sorted((shown | set(SMUGGLED)) - accepted)


def _matches(template: str, url: str) -> bool:
    parts, wanted = template.strip("/").split("/"), url.split("?")[0].strip("/").split("/")
    return len(parts) == len(wanted) and all(
        p == w or (p.startswith("{") and p.endswith("}"))
        for p, w in zip(parts, wanted, strict=True)
    )


def value_for(field: str, org: Org) -> Any:
    """A value a grab would send: another tenant's or user's id, a state, a time."""
    if field.endswith("_at"):
        return "2040-01-01T00:00:00Z"
    if field in {"state"}:
        return "approved"
    if field in {"is_staff", "is_superuser", "approved"}:
        return True
    if field in {"path"}:
        return f"/{org.bravo.pk}/"
    if field in {"role"}:
        return "admin"
    return org.bravo.pk


MODELS = [
    "tenants.Tenant",
    "tenants.Project",
    "tenants.Membership",
    "tenants.ResourceFlavor",
    "tenants.Quota",
    "tenants.PriorityClass",
    "tenants.PriorityDefault",
    "tenants.ApprovalPolicy",
    "tenants.ApprovalRequest",
    "tenants.IdleRule",
    "scheduler.Job",
    "scheduler.Node",
    "scheduler.GpuDevice",
    "scheduler.Cluster",
    "billing.RateCard",
    "billing.Budget",
    "billing.Statement",
    "billing.StatementLine",
    "billing.CostExport",
    "whatif.WhatIf",
    "capacity.PoolTarget",
    "capacity.TcoInputs",
    "capacity.RateSuggestion",
    "authtoken.Token",
    "auth.User",
]


def stored() -> dict[str, list[dict[str, Any]]]:
    """Every row a write could touch, to compare before and after the refused bodies."""
    return {name: list(apps.get_model(name).objects.order_by("pk").values()) for name in MODELS}


def test_every_write_route_has_an_entry() -> None:
    missing = [key for key in write_routes() if key not in WRITES]
    assert not missing, f"API writes without a mass-assignment entry: {missing}"
    stale = [key for key in WRITES if key not in write_routes()]
    assert not stale, f"mass-assignment entries for routes that no longer exist: {stale}"


@pytest.mark.parametrize(("name", "method"), write_routes(), ids=lambda v: str(v))
def test_a_field_the_caller_may_not_set_is_refused_and_stored_nowhere(
    org: Org, client_for: Any, monkeypatch: pytest.MonkeyPatch, name: str, method: str
) -> None:
    write = WRITES[(name, method)]
    if write.clock is not None:
        write.clock(monkeypatch)
    org.users["alice"].set_password("pw")
    org.users["alice"].save()
    url, body = write.make(org)
    client = APIClient() if write.persona == "anonymous" else client_for(write.persona)
    fields = forbidden_fields(url, method)
    assert "gantry_unknown_field" in fields
    before = stored()
    for field in fields:
        sent = {**body, field: value_for(field, org)}
        response = client.generic(method, url, data=_json(sent), content_type="application/json")
        assert response.status_code == 400, (name, field, response.status_code, response.content)
        assert field in response.json().get("errors", {}), (name, field, response.json())
    assert stored() == before, f"{name}: a refused body changed something"
    response = client.generic(method, url, data=_json(body), content_type="application/json")
    assert response.status_code in write.ok, (name, response.status_code, response.content)


def _json(body: dict[str, Any]) -> str:
    return json.dumps(body)


# Inside a job's spec: what the scheduler, not the submitter, decides.
SPEC_SMUGGLED = ["state", "tenant", "submitted_by", "attempt", "priority_value", "node"]


@pytest.mark.parametrize("url", ["/api/v1/jobs/", "/api/v1/quotes/"])
@pytest.mark.parametrize("field", SPEC_SMUGGLED)
def test_a_spec_field_the_submitter_may_not_set_is_refused(
    org: Org, client_for: Any, url: str, field: str
) -> None:
    body = {"project": org.proj_alpha.pk, "spec": {**job_spec(), field: value_for(field, org)}}
    before = stored()
    response = client_for("alice").post(url, body, format="json")
    assert response.status_code == 400, (field, response.content)
    assert field in response.json()["errors"]["spec"], response.json()
    assert stored() == before
