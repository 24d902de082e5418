"""Findings of fuzzing the served schema (issue 17, point 13), each kept as a regression test:
bodies that are not objects, wrong JSON types, permission before the body, and a schema that
declares what the server does (nullable fields, error answers, bounds)."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from tenants.models import PriorityClass
from tests import factories as f
from tests.conftest import Org

ACTIONS = ["cordon", "drain", "fail", "heal", "uncordon"]
NOT_OBJECTS = ["[1, 2]", '"text"', "true", "null", "3"]


def post_raw(client: Any, url: str, body: str) -> Any:
    return client.generic("POST", url, body, content_type="application/json")


@pytest.mark.parametrize("body", NOT_OBJECTS)
@pytest.mark.parametrize("action", [*ACTIONS, "report"])
def test_a_body_that_is_not_an_object_is_400_for_node_routes(
    org: Org, client_for: Any, action: str, body: str
) -> None:
    node = f.NodeFactory(name="n1")
    url = "/api/v1/nodes/report/" if action == "report" else f"/api/v1/nodes/{node.pk}/{action}/"
    response = post_raw(client_for("pat"), url, body)
    assert response.status_code == 400, response.content
    assert "non_field_errors" in response.json()["errors"]
    node.refresh_from_db()
    assert (node.cordoned, node.drain_requested, node.sim_failed) == (False, False, False)


@pytest.mark.parametrize("body", NOT_OBJECTS[:3])
@pytest.mark.parametrize("action", [*ACTIONS, "report"])
def test_finance_gets_403_on_node_routes_whatever_the_body(
    org: Org, client_for: Any, action: str, body: str
) -> None:
    node = f.NodeFactory(name="n1")
    url = "/api/v1/nodes/report/" if action == "report" else f"/api/v1/nodes/{node.pk}/{action}/"
    assert post_raw(client_for("carol"), url, body).status_code == 403


def wrong_types(org: Org) -> list[tuple[str, str, str, dict[str, Any], str]]:
    """(persona, method, url, body, field)."""
    node = f.NodeFactory(name="n2")
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    policy = {"tenant": org.alpha.pk, "rule": "priority_at_least"}
    return [
        ("tina", "patch", f"/api/v1/projects/{org.proj_alpha.pk}/", {"name": 0}, "name"),
        ("tina", "patch", f"/api/v1/tenants/{org.alpha.pk}/", {"name": 7}, "name"),
        (
            "dana",
            "post",
            "/api/v1/tenants/",
            {"parent": org.research.pk, "slug": 5, "name": "x"},
            "slug",
        ),
        ("pat", "post", f"/api/v1/nodes/{node.pk}/cordon/", {"reason": 12}, "reason"),
        (
            "tina",
            "post",
            "/api/v1/priority-defaults/",
            {"tenant": org.alpha.pk, "job_type": "training", "priority_class": 3},
            "priority_class",
        ),
        (
            "tina",
            "post",
            "/api/v1/approval-policies/",
            {**policy, "priority_class": ""},
            "priority_class",
        ),
        ("tina", "post", "/api/v1/approval-policies/", {**policy, "active": "yes"}, "active"),
        ("alice", "post", f"/api/v1/jobs/{job.pk}/cancel/", {"reason": 5}, "reason"),
        (
            "alice",
            "post",
            "/api/v1/jobs/",
            {"project": str(org.proj_alpha.pk), "spec": {}},
            "project",
        ),
        (
            "tina",
            "post",
            "/api/v1/memberships/",
            {"tenant": org.alpha.pk, "username": 42, "role": "member"},
            "username",
        ),
        ("pat", "post", "/api/v1/priority-classes/", {"name": 9, "value": 1}, "name"),
        ("pat", "post", "/api/v1/flavors/", {"name": 9, "kind": "gpu"}, "name"),
        (
            "dana",
            "post",
            "/api/v1/quotas/",
            {
                "tenant": org.alpha.pk,
                "flavor": org.a100.pk,
                "guaranteed_milli": "1000",
                "limit_milli": 1000,
            },
            "guaranteed_milli",
        ),
    ]


def test_values_of_the_wrong_json_type_are_400_naming_the_field(org: Org, client_for: Any) -> None:
    priority_classes = PriorityClass.objects.count()
    for persona, method, url, body, field in wrong_types(org):
        response = getattr(client_for(persona), method)(url, body, format="json")
        assert response.status_code == 400, (url, body, response.content)
        assert field in response.json()["errors"], (url, response.json())
    org.proj_alpha.refresh_from_db()
    assert org.proj_alpha.name != "0"
    assert PriorityClass.objects.count() == priority_classes


def schema(client_for: Any) -> dict[str, Any]:
    response = client_for("alice").get("/api/v1/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    return dict(response.json())


@pytest.mark.parametrize(
    ("component", "field"),
    [
        ("ApprovalPolicyOut", "priority_class"),
        ("ApprovalRequestOut", "decided_by"),
        ("AuditEntryOut", "before"),
        ("AuditEntryOut", "after"),
        ("AuditEntryOut", "tenant_slug"),
        ("JobEventOut", "actor"),
    ],
)
def test_fields_that_can_be_null_are_declared_nullable(
    org: Org, client_for: Any, component: str, field: str
) -> None:
    properties = schema(client_for)["components"]["schemas"][component]["properties"]
    assert properties[field].get("nullable") is True, properties[field]


def test_the_schema_documents_errors_and_bounds(org: Org, client_for: Any) -> None:
    cache.clear()
    paths = schema(client_for)["paths"]
    jobs = paths["/api/v1/jobs/"]
    for code in ("400", "401", "403", "404"):
        body = jobs["get"]["responses"][code]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/Error"}
    assert {"409", "413", "415"} <= set(jobs["post"]["responses"])
    page_size = next(p for p in jobs["get"]["parameters"] if p["name"] == "page_size")
    assert (page_size["schema"]["minimum"], page_size["schema"]["maximum"]) == (1, 200)
    token = paths["/api/v1/auth/token/"]["post"]["responses"]
    assert "429" in token


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/approval-policies/-1.4408937856860856e-92/",  # the id the fuzzer sent
        "/api/v1/jobs/-1.4408937856860856e-92/events/",
        "/api/v1/no-such-route/",
    ],
)
@pytest.mark.parametrize("method", ["get", "post"])
def test_an_api_path_that_matches_no_route_is_404_in_the_error_shape(
    org: Org, client_for: Any, url: str, method: str
) -> None:
    """The portal's HTML page answered these, where the schema promises the JSON error."""
    response = getattr(client_for("pat"), method)(url)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Not found."}
    portal = client_for("pat").get("/no-such-page/")
    assert portal.status_code == 404 and portal["Content-Type"].startswith("text/html")


def test_an_empty_format_is_400_naming_it(org: Org, client_for: Any) -> None:
    """`?format=` was read as no format at all, where every other empty parameter is refused."""
    response = client_for("alice").get("/api/v1/audit/export.csv?format=")
    assert response.status_code == 400, response.content
    assert "format" in response.json()["errors"]
    assert client_for("alice").get("/api/v1/audit/export.csv?format=csv").status_code == 200


@pytest.mark.parametrize(
    ("persona", "query", "status"),
    [
        ("alice", "?format=csv&at_before=%C3%B6y%C2%B6", 400),  # the fuzzer's bad date
        (None, "?format=csv", 403),
    ],
    ids=["bad-filter", "anonymous"],
)
def test_the_audit_export_answers_errors_in_json_whatever_the_format(
    org: Org, client_for: Any, persona: str | None, query: str, status: int
) -> None:
    """The CSV renderer wrote the error with `Content-Type: text/csv`, where the schema
    declares the JSON error shape."""
    client = client_for(persona) if persona else APIClient()
    response = client.get(f"/api/v1/audit/export.csv{query}")
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    assert "detail" in response.json()


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/api/v1/quotas/?page=157642005&tenant=427939965654415628566528", "tenant"),
        (
            "/api/v1/budgets/?policy=approval&unit=gpu_hours&tenant=124818476750162550239264768"
            "&month=5224-08-15&page_size=100&page=220283485",
            "tenant",
        ),
        (f"/api/v1/jobs/?project={2**63}", "project"),
        (f"/api/v1/audit/?tenant=-{2**63 + 1}", "tenant"),
    ],
    ids=["quotas", "budgets", "jobs", "audit"],
)
def test_an_id_beyond_64_bits_in_a_filter_is_400_naming_it(
    org: Org, client_for: Any, url: str, field: str
) -> None:
    """SQLite cannot bind an integer past 64 bits: the lookup raised OverflowError (500) on
    the embedded default. No row has such an id, and the filter says so."""
    response = client_for("pat").get(url)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()


def test_an_empty_tenant_on_usage_is_400_naming_it(org: Org, client_for: Any) -> None:
    """`/usage/?tenant=` answered the caller's own tenants, as if the parameter were left out:
    the query was read as an HTML form's, where an empty optional field means "not sent"."""
    response = client_for("alice").get("/api/v1/usage/?tenant=")
    assert response.status_code == 400, response.content
    assert "tenant" in response.json()["errors"]
    assert client_for("alice").get(f"/api/v1/usage/?tenant={org.alpha.pk}").status_code == 200


def test_a_jobs_pods_are_declared_as_the_paginated_page_they_are(org: Org, client_for: Any) -> None:
    """`GET /jobs/{id}/pods/` answered a page (`count`, `results`, ...) where the schema
    declared a single pod; found by bench.fuzz's sequences, which reach a job that exists."""
    job = f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    response = client_for("tina").get(f"/api/v1/jobs/{job.pk}/pods/")
    assert response.status_code == 200
    assert set(response.json()) == {"count", "next", "previous", "results"}
    declared = schema(client_for)["paths"]["/api/v1/jobs/{id}/pods/"]["get"]["responses"]["200"]
    body = declared["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/PaginatedPodOutList"}
