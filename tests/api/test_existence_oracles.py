"""What an answer must not give away (issue 17, points 11 and 13).

- A quota request's errors named the siblings' guarantees and the parent's figures, which the
  asking team admin cannot see.
- Adding a member looked the username up before the caller's rights: anyone learned which
  usernames exist.
- A foreign-key filter answered 400 for an id that does not exist and an empty page for one the
  user may not see: ids of other tenants' objects could be told apart. Both are now an empty
  page, for every foreign-key filter of every list endpoint.
- Query values that are not valid were taken (`?depth=0.5`, `?ready=null`, an empty value).
"""

from __future__ import annotations

from typing import Any

import django_filters
import pytest

from common.api.filters import StrictFilterBackend
from scheduler.api.urls import router as scheduler_router
from scheduler.models import Job
from tenants.api.urls import router as tenants_router
from tenants.models import Membership
from tests import factories as f
from tests.conftest import Org

NOWHERE = 987654321  # an id no row has


def ask_quota(client: Any, org: Org, guaranteed_gpus: int) -> Any:
    body = {"tenant": org.alpha.pk, "flavor": org.h100.pk,
            "guaranteed_milli": guaranteed_gpus * 1000, "limit_milli": 32000}  # fmt: skip
    return client.post("/api/v1/quota-requests/", body, format="json")


def test_a_quota_request_error_shows_no_sibling_or_parent_figure(org: Org, client_for: Any) -> None:
    # research guarantees 32 H100; team-bravo holds 16 of it, team-alpha asks for 20
    response = ask_quota(client_for("tina"), org, 20)
    assert response.status_code == 400
    text = str(response.json())
    assert "left to guarantee" in text
    for secret in ("bravo", "16 GPUs", "32 GPUs", "36 GPUs"):
        assert secret not in text, secret


def test_an_admin_above_still_sees_the_figures(org: Org, client_for: Any) -> None:
    response = ask_quota(client_for("dana"), org, 20)
    assert response.status_code == 400
    assert "team-bravo 16 GPUs" in str(response.json())


def test_adding_a_member_tells_a_non_admin_nothing_about_usernames(
    org: Org, client_for: Any
) -> None:
    answers = [
        client_for("alice").post(
            "/api/v1/memberships/",
            {"tenant": org.alpha.pk, "username": name, "role": "member"},
            format="json",
        )
        for name in ("bob-bravo", "no-such-user")
    ]
    assert [a.status_code for a in answers] == [403, 403]
    assert answers[0].json() == answers[1].json()
    assert not Membership.objects.filter(user__username="bob-bravo", tenant=org.alpha).exists()


def test_an_admin_adding_an_unknown_user_gets_400_naming_the_field(
    org: Org, client_for: Any
) -> None:
    response = client_for("tina").post(
        "/api/v1/memberships/",
        {"tenant": org.alpha.pk, "username": "no-such-user", "role": "member"},
        format="json",
    )
    assert response.status_code == 400
    assert "no active user" in response.json()["errors"]["username"][0]


def foreign_ids(org: Org) -> dict[str, int]:
    """Ids that exist but that alice (team-alpha) may not see."""
    job = f.JobFactory(project=org.proj_bravo, submitted_by=org.users["bob-bravo"])
    return {
        "tenant": org.bravo.pk,
        "parent": org.product.pk,
        "project": org.proj_bravo.pk,
        "user": org.users["bob-bravo"].pk,
        "subject_id": job.pk,
    }


@pytest.mark.parametrize(
    ("url", "param"),
    [
        ("/api/v1/tenants/", "parent"),
        ("/api/v1/projects/", "tenant"),
        ("/api/v1/memberships/", "tenant"),
        ("/api/v1/memberships/", "user"),
        ("/api/v1/quotas/", "tenant"),
        ("/api/v1/priority-defaults/", "tenant"),
        ("/api/v1/approval-policies/", "tenant"),
        ("/api/v1/approval-requests/", "tenant"),
        ("/api/v1/approval-requests/inbox/", "tenant"),
        ("/api/v1/jobs/", "project"),
        ("/api/v1/jobs/", "tenant"),
    ],
)
def test_an_invisible_id_and_a_missing_id_give_the_same_answer(
    org: Org, client_for: Any, url: str, param: str
) -> None:
    invisible = foreign_ids(org)[param]
    client = client_for("alice")
    seen = client.get(url, {param: invisible})
    missing = client.get(url, {param: NOWHERE})
    assert (seen.status_code, seen.json()) == (missing.status_code, missing.json())
    assert seen.status_code == 200 and seen.json()["results"] == []


def test_the_audit_tenant_filter_gives_the_same_answer_too(org: Org, client_for: Any) -> None:
    client = client_for("tina")
    seen = client.get("/api/v1/audit/", {"tenant": org.bravo.pk})
    missing = client.get("/api/v1/audit/", {"tenant": NOWHERE})
    assert (seen.status_code, seen.json()) == (missing.status_code, missing.json())


CHOICE_OF_ROWS = (django_filters.ModelChoiceFilter, django_filters.ModelMultipleChoiceFilter)


def list_filtersets() -> list[tuple[str, type[Any]]]:
    backend = StrictFilterBackend()
    found = []
    for router in (tenants_router, scheduler_router):
        for prefix, viewset, _basename in router.registry:
            view = viewset()
            view.action = "list"
            model = view.get_serializer_class().Meta.model
            filterset = backend.get_filterset_class(view, model.objects.none())
            if filterset is not None:
                found.append((prefix, filterset))
    return found


def test_no_list_endpoint_filters_by_a_choice_of_rows() -> None:
    """The family guard: a ModelChoiceFilter answers 400 for a missing id only."""
    lists = list_filtersets()
    assert len(lists) >= 10
    offenders = [
        f"{prefix}?{name}"
        for prefix, filterset in lists
        for name, spec in filterset.base_filters.items()
        if isinstance(
            spec, django_filters.ModelChoiceFilter | django_filters.ModelMultipleChoiceFilter
        )
    ]
    assert not offenders


@pytest.mark.parametrize(
    ("persona", "query"),
    [
        ("alice", "/api/v1/tenants/?depth=0.5"),
        ("alice", "/api/v1/approval-requests/?subject_id=0.5"),
        ("pat", "/api/v1/nodes/?ready=null"),
        ("pat", "/api/v1/nodes/?cordoned=maybe"),
        ("alice", "/api/v1/jobs/?created_before="),
        ("alice", "/api/v1/jobs/?project="),
        ("alice", "/api/v1/jobs/?project=abc"),
        ("alice", "/api/v1/priority-classes/?preemptible=yes-please"),
    ],
)
def test_query_values_that_are_not_valid_are_400(
    org: Org, client_for: Any, persona: str, query: str
) -> None:
    response = client_for(persona).get(query)
    assert response.status_code == 400, response.json()
    param = query.split("?", 1)[1].split("=", 1)[0]
    assert param in response.json()["errors"]


def test_valid_query_values_still_filter(org: Org, client_for: Any) -> None:
    f.JobFactory(project=org.proj_alpha, submitted_by=org.users["alice"])
    client = client_for("alice")
    assert client.get("/api/v1/tenants/", {"depth": 2}).json()["count"] == 1  # team-alpha
    assert client.get("/api/v1/jobs/", {"project": org.proj_alpha.pk}).json()["count"] == 1
    assert Job.objects.count() == 1
    preemptible = client.get("/api/v1/priority-classes/", {"preemptible": "false"}).json()
    assert preemptible["count"] >= 1
