"""A project's namespace (issue 17, point 9): Gantry names and creates it, or a platform admin
assigns an existing one explicitly. A team admin pointing a project at any namespace would run
the team's jobs in another group's namespace, without Pod Security labels."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from tenants import services
from tenants.models import AuditEntry, Project
from tests.conftest import Org


def test_a_team_admin_cannot_point_a_project_at_a_namespace(org: Org, client_for: Any) -> None:
    with pytest.raises(PermissionDenied, match="Only platform admins assign a namespace"):
        services.project_create(
            user=org.users["tina"], tenant=org.alpha, slug="grab", name="G", namespace="ml-prod"
        )
    response = client_for("tina").post(
        "/api/v1/projects/",
        {"tenant": org.alpha.pk, "slug": "grab", "name": "Grab", "namespace": "proj-bravo"},
        format="json",
    )
    assert response.status_code == 403
    assert not Project.objects.filter(slug="grab").exists()


def test_a_team_admins_project_gets_a_namespace_named_after_it(org: Org, client_for: Any) -> None:
    response = client_for("tina").post(
        "/api/v1/projects/", {"tenant": org.alpha.pk, "slug": "vision", "name": "V"}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["namespace"] == "vision"


def test_a_platform_admin_assigns_an_existing_namespace(org: Org, client_for: Any) -> None:
    response = client_for("pat").post(
        "/api/v1/projects/",
        {"tenant": org.alpha.pk, "slug": "legacy", "name": "Legacy", "namespace": "ml-shared"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert Project.objects.get(slug="legacy").namespace == "ml-shared"
    entry = AuditEntry.objects.get(action="project.create", target_id=str(response.json()["id"]))
    assert entry.actor_name == "pat" and entry.after["namespace"] == "ml-shared"


@pytest.mark.parametrize(
    ("persona", "fields"),
    [
        ("tina", {"slug": "kube-system"}),
        ("tina", {"slug": "default"}),
        ("pat", {"slug": "ops", "namespace": "kube-system"}),
        ("pat", {"slug": "ops", "namespace": "gantry-system"}),
    ],
    ids=["admin-slug-kube-system", "admin-slug-default", "platform-kube-system", "platform-own"],
)
def test_system_namespaces_are_refused(
    org: Org, client_for: Any, persona: str, fields: dict[str, str]
) -> None:
    body = {"tenant": org.alpha.pk, "name": "X", **fields}
    response = client_for(persona).post("/api/v1/projects/", body, format="json")
    assert response.status_code == 400
    # the error is the field sent: the namespace a platform admin named, or the slug that
    # names it otherwise
    sent = "namespace" if "namespace" in fields else "slug"
    assert set(response.json()["errors"]) == {sent}
    assert "system namespace" in response.json()["errors"][sent][0]
    assert not Project.objects.filter(slug=fields["slug"]).exists()


@pytest.mark.parametrize("persona", ["tina", "pat"])
def test_a_namespace_cannot_be_changed_afterwards(org: Org, client_for: Any, persona: str) -> None:
    response = client_for(persona).patch(
        f"/api/v1/projects/{org.proj_alpha.pk}/", {"namespace": "proj-bravo-2"}, format="json"
    )
    assert response.status_code == 400
    assert "namespace" in response.json()["errors"]
    org.proj_alpha.refresh_from_db()
    assert org.proj_alpha.namespace == "proj-alpha"


def test_the_service_refuses_a_system_namespace(org: Org) -> None:
    with pytest.raises(ValidationError):
        services.project_create(
            user=org.users["pat"], tenant=org.alpha, slug="x", name="X", namespace="kube-public"
        )
