"""Bad input and abuse at the API boundary (docs/faults.md 24, 25, 27, 28): clear 4xx, no change."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from rest_framework.authtoken.models import Token

from scheduler.models import Job
from tenants.models import Membership, Project, Tenant
from tests.conftest import Org, job_spec


def post_raw(client: Any, url: str, body: str) -> Any:
    return client.generic("POST", url, data=body, content_type="application/json")


# --- 24: huge payloads, deep JSON, long strings, huge pages ------------------------------


def test_huge_payload_is_413_and_creates_nothing(org: Org, client_for: Any, settings: Any) -> None:
    body = json.dumps(
        {
            "project": org.proj_alpha.pk,
            "spec": job_spec(env={"BLOB": "x" * (settings.GANTRY_MAX_BODY_BYTES + 1)}),
        }
    )
    response = post_raw(client_for("alice"), "/api/v1/jobs/", body)
    assert response.status_code == 413
    assert "exceeds the limit" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_deep_json_is_400(org: Org, client_for: Any) -> None:
    deep = "[" * 5000 + "]" * 5000
    response = post_raw(client_for("alice"), "/api/v1/jobs/", deep)
    assert response.status_code == 400
    assert "nesting" in response.json()["detail"]


def test_moderately_deep_spec_is_400(org: Org, client_for: Any) -> None:
    nested: Any = "x"
    for _ in range(30):
        nested = {"k": nested}
    body = json.dumps({"project": org.proj_alpha.pk, "spec": job_spec(env={"A": nested})})
    response = post_raw(client_for("alice"), "/api/v1/jobs/", body)
    assert response.status_code == 400
    assert Job.objects.count() == 0


def test_malformed_json_is_400(org: Org, client_for: Any) -> None:
    response = post_raw(client_for("alice"), "/api/v1/jobs/", '{"project": ')
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "a" * 10_000), ("image", "r/" + "a" * 10_000)],
    ids=["long-name", "long-image"],
)
def test_long_strings_are_400(org: Org, client_for: Any, field: str, value: str) -> None:
    response = client_for("alice").post(
        "/api/v1/jobs/",
        {"project": org.proj_alpha.pk, "spec": job_spec(**{field: value})},
        format="json",
    )
    assert response.status_code == 400
    assert field in response.json()["errors"]["spec"]


@pytest.mark.parametrize("size", ["100000000", "0", "-1", "abc", "201"])
def test_absurd_page_size_is_400(org: Org, client_for: Any, size: str) -> None:
    response = client_for("alice").get(f"/api/v1/jobs/?page_size={size}")
    assert response.status_code == 400
    assert "page_size" in response.json()["errors"]


@pytest.mark.parametrize("page", ["0", "-1", "abc", "1.5"])
def test_a_page_that_is_no_page_number_is_400(org: Org, client_for: Any, page: str) -> None:
    response = client_for("pat").get(f"/api/v1/tenants/?page={page}")
    assert response.status_code == 400
    assert response.json()["errors"]["page"] == [f"must be a whole number from 1, got {page!r}."]


def test_a_page_past_the_last_is_404_naming_the_last(org: Org, client_for: Any) -> None:
    response = client_for("pat").get("/api/v1/tenants/?page=99999&page_size=4")
    assert response.status_code == 404
    assert response.json()["detail"] == "Page 99999 is past the last page, 2 (4 a page)."
    assert client_for("pat").get("/api/v1/tenants/?page=last&page_size=4").status_code == 200


def test_page_size_within_bounds_is_honoured(org: Org, client_for: Any) -> None:
    response = client_for("pat").get("/api/v1/tenants/?page_size=2")
    assert response.status_code == 200
    assert len(response.json()["results"]) == 2
    assert response.json()["count"] == 6


# --- 25: control characters and formula prefixes ------------------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "Team\x00Null",
        "Team\x1b[31mred",
        '=HYPERLINK("http://x")',
        "+cmd",
        "@SUM(A1)",
        "Right\u202eLeft",
    ],
    ids=["nul", "ansi-escape", "formula-eq", "formula-plus", "formula-at", "bidi-override"],
)
def test_display_names_refuse_control_and_formula(org: Org, client_for: Any, name: str) -> None:
    response = client_for("tina").post(
        "/api/v1/projects/",
        {"tenant": org.alpha.pk, "slug": "new-proj", "name": name},
        format="json",
    )
    assert response.status_code == 400, response.json()
    assert "name" in response.json()["errors"]
    assert not Project.objects.filter(slug="new-proj").exists()


@pytest.mark.parametrize("slug", ["Team-A", "-team", "team_a", "a" * 64, "tëam", "t\nx"])
def test_slugs_must_be_dns_labels(org: Org, client_for: Any, slug: str) -> None:
    response = client_for("dana").post(
        "/api/v1/tenants/", {"parent": org.research.pk, "slug": slug, "name": "New"}, format="json"
    )
    assert response.status_code == 400
    assert "slug" in response.json()["errors"]
    assert Tenant.objects.count() == 6


# --- 27: CSRF on session writes; tokens need no cookie -----------------------------------


def test_session_write_without_csrf_is_refused(org: Org) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(org.users["alice"])
    body = json.dumps({"project": org.proj_alpha.pk, "spec": job_spec()})
    response = client.post("/api/v1/jobs/", body, content_type="application/json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert Job.objects.count() == 0


def test_session_write_with_csrf_token_passes(org: Org) -> None:
    client = Client(enforce_csrf_checks=True)
    client.get("/accounts/login/")  # the login form sets the csrftoken cookie
    client.force_login(org.users["alice"])
    token = client.cookies["csrftoken"].value
    body = json.dumps({"project": org.proj_alpha.pk, "spec": job_spec()})
    response = client.post(
        "/api/v1/jobs/", body, content_type="application/json", headers={"X-CSRFToken": token}
    )
    assert response.status_code == 201, response.json()


def test_token_auth_needs_no_csrf(org: Org) -> None:
    token = Token.objects.create(user=org.users["alice"])
    client = Client(enforce_csrf_checks=True)
    body = json.dumps({"project": org.proj_alpha.pk, "spec": job_spec()})
    response = client.post(
        "/api/v1/jobs/",
        body,
        content_type="application/json",
        headers={"Authorization": f"Token {token.key}"},
    )
    assert response.status_code == 201, response.json()


def test_token_endpoint_issues_token_for_valid_credentials(org: Org) -> None:
    response = Client().post(
        "/api/v1/auth/token/", {"username": "alice", "password": "correct-horse-battery"}
    )
    assert response.status_code == 200
    assert response.json()["token"] == Token.objects.get(user=org.users["alice"]).key
    bad = Client().post("/api/v1/auth/token/", {"username": "alice", "password": "nope"})
    assert bad.status_code == 400


# --- 28: privileged fields from a member -------------------------------------------------


@pytest.mark.parametrize(
    "extra",
    [
        {"state": "running"},
        {"approved_by": 1},
        {"submitted_by": "pat"},
        {"tenant": 1},
        {"priority": 9999},
    ],
    ids=["state", "approved_by", "submitted_by", "tenant", "unknown-priority-field"],
)
def test_member_cannot_set_privileged_job_fields(
    org: Org, client_for: Any, extra: dict[str, Any]
) -> None:
    response = client_for("alice").post(
        "/api/v1/jobs/", {"project": org.proj_alpha.pk, "spec": job_spec(**extra)}, format="json"
    )
    assert response.status_code == 400
    assert next(iter(extra)) in json.dumps(response.json()["errors"])
    assert Job.objects.count() == 0


def test_member_cannot_grant_roles(org: Org, client_for: Any) -> None:
    response = client_for("alice").post(
        "/api/v1/memberships/",
        {"tenant": org.alpha.pk, "username": "alice", "role": "admin"},
        format="json",
    )
    assert response.status_code == 403
    assert Membership.objects.get(user=org.users["alice"], tenant=org.alpha).role == "member"


def test_envelope_refuses_unknown_fields(org: Org, client_for: Any) -> None:
    response = client_for("alice").post(
        "/api/v1/jobs/",
        {"project": org.proj_alpha.pk, "spec": job_spec(), "state": "running"},
        format="json",
    )
    assert response.status_code == 400
    assert "state" in response.json()["errors"]


def test_read_only_tenant_fields_are_refused(org: Org, client_for: Any) -> None:
    response = client_for("tina").patch(
        f"/api/v1/tenants/{org.alpha.pk}/", {"parent": org.product.pk, "path": "/1/"}, format="json"
    )
    assert response.status_code == 400
    org.alpha.refresh_from_db()
    assert org.alpha.parent_id == org.research.pk


def test_a_clash_no_one_field_owns_is_filed_as_non_field_errors(org: Org, client_for: Any) -> None:
    """A model's own check of a unique pair came back under "__all__", beside DRF's
    "non_field_errors" for the same kind of error elsewhere: one key now."""
    taken = {"tenant": org.alpha.pk, "slug": org.proj_alpha.slug, "name": "Again"}
    response = client_for("tina").post("/api/v1/projects/", taken, format="json")
    assert response.status_code == 400, response.json()
    errors = response.json()["errors"]
    assert "__all__" not in errors and errors["non_field_errors"], errors
    # the namespace, named after the slug, clashed too: said of the slug, the field sent
    assert "namespace" not in errors
    assert "a project's Kubernetes namespace is named after its slug" in errors["slug"][0]
