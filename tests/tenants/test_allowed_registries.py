"""Images limited to each tenant's allowed registries (issue 21, security sweep): the lists are
inherited down the tree, each list above binds, a list may only narrow those above it, they
are set from above (as quotas) and audited, and a refused submission creates nothing."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Job, JobEvent
from tenants.models import ApprovalRequest, AuditEntry, Tenant
from tests import factories as f
from tests.conftest import Org, job_spec

pytestmark = pytest.mark.django_db
JOBS = "/api/v1/jobs/"
NGC = "nvcr.io/nvidia/pytorch:24.05-py3"
OWN = "registry.example.com/nlp/bert:1.2"


def url(tenant: Tenant) -> str:
    return f"/api/v1/tenants/{tenant.pk}/registries/"


def allow(tenant: Tenant, *entries: str) -> None:
    Tenant.objects.filter(pk=tenant.pk).update(allowed_registries=list(entries))


def submit(client: Any, project: Any, image: str) -> Any:
    spec = job_spec(image=image, replicas=1, resources={"gpus": 1})
    return client.post(JOBS, {"project": project.pk, "spec": spec}, format="json")


def test_without_a_list_up_the_tree_every_registry_is_allowed(org: Org, client_for: Any) -> None:
    response = submit(client_for("alice"), org.proj_alpha, OWN)
    assert response.status_code == 201, response.json()
    assert client_for("alice").get(url(org.alpha)).json() == {
        "tenant": org.alpha.pk,
        "own": [],
        "effective": None,
        "origin": "default",
    }


@pytest.mark.parametrize("holder", ["acme", "research", "alpha"])
def test_a_list_at_each_level_of_the_tree_binds_the_teams_below(
    org: Org, client_for: Any, holder: str
) -> None:
    allow(getattr(org, holder), "nvcr.io/nvidia")
    alice = client_for("alice")
    refused = submit(alice, org.proj_alpha, OWN)
    assert refused.status_code == 400, refused.json()
    (message,) = refused.json()["errors"]["spec"]["image"]
    assert OWN in message and "nvcr.io/nvidia" in message
    # Nothing was created: no job, no event, no approval request, no audit entry.
    assert not Job.objects.exists() and not JobEvent.objects.exists()
    assert not ApprovalRequest.objects.exists()
    assert not AuditEntry.objects.filter(action="job.submit").exists()
    assert submit(alice, org.proj_alpha, NGC).status_code == 201
    # A team outside the list's subtree is not bound by it.
    charlie_free = holder != "acme"
    assert (submit(client_for("chris"), org.proj_charlie, OWN).status_code == 201) is charlie_free


def test_a_prefix_allows_only_whole_path_components(org: Org, client_for: Any) -> None:
    allow(org.acme, "nvcr.io/nvidia")
    response = submit(client_for("alice"), org.proj_alpha, "nvcr.io/nvidiaevil/x:1")
    assert response.status_code == 400, response.json()
    assert not Job.objects.exists()


def test_docker_hub_short_names_are_matched_as_docker_reads_them(org: Org, client_for: Any) -> None:
    allow(org.acme, "docker.io/pytorch", "docker.io/library")
    alice = client_for("alice")
    assert submit(alice, org.proj_alpha, "pytorch/pytorch:2.4").status_code == 201
    assert submit(alice, org.proj_alpha, "ubuntu:24.04").status_code == 201
    assert submit(alice, org.proj_alpha, "nvidia/cuda:12.4").status_code == 400


def test_the_nearest_list_is_shown_and_a_list_above_binds_an_older_wider_one_below(
    org: Org, client_for: Any
) -> None:
    allow(org.alpha, "nvcr.io")  # written while nothing above limited it
    allow(org.acme, "docker.io/pytorch")  # the organisation narrowed later
    research = client_for("dana").get(url(org.research)).json()
    assert (research["origin"], research["effective"]) == ("inherited", ["docker.io/pytorch"])
    alice = client_for("alice")
    assert alice.get(url(org.alpha)).json()["origin"] == "own"
    refused = submit(alice, org.proj_alpha, NGC)
    assert refused.status_code == 400
    assert "set on acme" in refused.json()["errors"]["spec"]["image"][0]


@pytest.mark.parametrize(
    ("entries", "wider"),
    [
        (["nvcr.io"], "nvcr.io"),
        (["nvcr.io/nvidiaevil"], "nvcr.io/nvidiaevil"),
        (["nvcr.io/nvidia/pytorch", "ghcr.io/x"], "ghcr.io/x"),
    ],
)
def test_a_child_may_only_narrow_its_parents_list(
    org: Org, client_for: Any, entries: list[str], wider: str
) -> None:
    allow(org.research, "nvcr.io/nvidia")
    dana = client_for("dana")
    response = dana.put(url(org.alpha), {"allowed_registries": entries}, format="json")
    assert response.status_code == 400, response.json()
    (message,) = response.json()["errors"]["allowed_registries"]
    assert message.startswith(wider) and "research" in message
    assert Tenant.objects.get(pk=org.alpha.pk).allowed_registries == []
    assert not AuditEntry.objects.filter(action="tenant.allowed_registries.set").exists()


@pytest.mark.parametrize("admin", ["dana", "pat"])
def test_admins_above_set_the_list_normalised_and_audited(
    org: Org, client_for: Any, admin: str
) -> None:
    allow(org.research, "nvcr.io/nvidia", "docker.io/pytorch")
    body = {"allowed_registries": ["NVCR.io/nvidia/pytorch/", "index.docker.io/pytorch"]}
    response = client_for(admin).put(url(org.alpha), body, format="json")
    assert response.status_code == 200, response.json()
    narrowed = ["nvcr.io/nvidia/pytorch", "docker.io/pytorch"]
    assert response.json() == {
        "tenant": org.alpha.pk,
        "own": narrowed,
        "effective": narrowed,
        "origin": "own",
    }
    entry = AuditEntry.objects.get(action="tenant.allowed_registries.set")
    assert (entry.actor_name, entry.tenant_id) == (admin, org.alpha.pk)
    assert entry.before == {"allowed_registries": []}
    assert entry.after == {"allowed_registries": narrowed}
    # Emptied, the team follows the list above again.
    cleared = client_for(admin).put(url(org.alpha), {"allowed_registries": []}, format="json")
    assert cleared.json()["origin"] == "inherited"
    assert AuditEntry.objects.filter(action="tenant.allowed_registries.set").count() == 2


@pytest.mark.parametrize(("persona", "code"), [("tina", 403), ("alice", 403), ("bob-bravo", 404)])
def test_the_teams_own_admin_and_others_cannot_set_it(
    org: Org, client_for: Any, persona: str, code: int
) -> None:
    allow(org.alpha, "nvcr.io/nvidia")
    body = {"allowed_registries": []}
    assert client_for(persona).put(url(org.alpha), body, format="json").status_code == code
    assert Tenant.objects.get(pk=org.alpha.pk).allowed_registries == ["nvcr.io/nvidia"]


def test_an_organisations_list_is_set_by_platform_admins_only(org: Org, client_for: Any) -> None:
    org.users["olga"] = f.UserFactory(username="olga")
    f.MembershipFactory(user=org.users["olga"], tenant=org.acme, role="admin")
    body = {"allowed_registries": ["nvcr.io/nvidia"]}
    olga = client_for("olga")
    assert olga.put(url(org.acme), body, format="json").status_code == 403
    assert olga.put(url(org.research), body, format="json").status_code == 200
    assert client_for("pat").put(url(org.acme), body, format="json").status_code == 200


@pytest.mark.parametrize(
    "entries",
    [["pytorch"], ["nvcr.io/nvidia/pytorch:24.05"], ["not a host.io"], ["x.io"] * 65, "nvcr.io"],
)
def test_bad_entries_are_refused_by_field(org: Org, client_for: Any, entries: Any) -> None:
    response = client_for("pat").put(url(org.alpha), {"allowed_registries": entries}, format="json")
    assert response.status_code == 400, response.json()
    assert "allowed_registries" in response.json()["errors"]
    assert Tenant.objects.get(pk=org.alpha.pk).allowed_registries == []
