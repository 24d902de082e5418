"""The portal's registries tab (issue 21): everyone who sees the tenant reads the list in force;
admins above it set the tenant's own list, narrowing only; the team's own admin cannot."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from scheduler.models import Job
from tenants.models import AuditEntry, Tenant
from tests.conftest import Org
from tests.portal.test_jobs import field_errors, form_body

pytestmark = pytest.mark.django_db


def page(org: Org) -> str:
    return reverse("portal:tenant-registries", args=[org.alpha.pk])


def test_a_member_reads_the_list_in_force_without_a_form(org: Org, web_for: Any) -> None:
    Tenant.objects.filter(pk=org.research.pk).update(allowed_registries=["nvcr.io/nvidia"])
    html = web_for("alice").get(page(org)).content.decode()
    assert "<code>nvcr.io/nvidia</code>" in html and "Inherited from a tenant above" in html
    assert 'id="registries-form"' not in html


def test_an_admin_above_sets_the_list_audited(org: Org, web_for: Any) -> None:
    response = web_for("dana").post(page(org), {"entries": "nvcr.io/nvidia\n\ndocker.io/pytorch"})
    assert response.status_code == 302
    assert Tenant.objects.get(pk=org.alpha.pk).allowed_registries == [
        "nvcr.io/nvidia",
        "docker.io/pytorch",
    ]
    assert AuditEntry.objects.filter(action="tenant.allowed_registries.set").count() == 1


def test_a_wider_list_is_refused_on_the_field(org: Org, web_for: Any) -> None:
    Tenant.objects.filter(pk=org.research.pk).update(allowed_registries=["nvcr.io/nvidia"])
    response = web_for("dana").post(page(org), {"entries": "nvcr.io"})
    assert response.status_code == 400
    assert "a tenant may only narrow the list above it" in response.content.decode()
    assert Tenant.objects.get(pk=org.alpha.pk).allowed_registries == []


@pytest.mark.parametrize(("persona", "code"), [("tina", 403), ("bob-bravo", 404)])
def test_the_teams_own_admin_and_other_teams_cannot_set_it(
    org: Org, web_for: Any, persona: str, code: int
) -> None:
    response = web_for(persona).post(page(org), {"entries": "nvcr.io"})
    assert response.status_code == code
    assert Tenant.objects.get(pk=org.alpha.pk).allowed_registries == []


def test_the_submit_form_refuses_an_image_from_another_registry_on_its_field(
    org: Org, web_for: Any
) -> None:
    Tenant.objects.filter(pk=org.acme.pk).update(allowed_registries=["nvcr.io/nvidia"])
    response = web_for("alice").post(reverse("portal:job-new"), form_body(org))
    assert response.status_code == 400
    errors = field_errors(response.content.decode(), "image")
    assert "registry.example.com/nlp/bert:1.2" in errors and "nvcr.io/nvidia" in errors
    assert not Job.objects.exists()
