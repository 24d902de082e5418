"""Submission: idempotency keys (docs/faults.md 18), priority defaults, who may submit."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.exceptions import PermissionDenied
from rest_framework.exceptions import ValidationError

from common.errors import ConflictError
from scheduler.jobs import services
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobEvent
from tenants.models import PriorityClass
from tenants.services import priority_default_set
from tests.concurrency import run_in_threads
from tests.conftest import Org, job_spec

JOBS = "/api/v1/jobs/"


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # The org fixture hashes a password per persona; the production hasher dominates runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def submit(org: Org, username: str = "alice", key: str | None = None, **spec: Any) -> Any:
    return job_submit(
        user=org.users[username],
        project=org.proj_alpha,
        payload=job_spec(**spec),
        idempotency_key=key,
    )


# --- idempotency (service) ----------------------------------------------------------------


def test_same_key_same_body_returns_the_first_job(org: Org) -> None:
    first, created = submit(org, key="click-1")
    again, created_again = submit(org, key="click-1")
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk
    assert Job.objects.count() == 1
    assert JobEvent.objects.filter(job=first, kind="submitted").count() == 1  # no second event


def test_same_key_same_body_in_another_key_order_is_the_same_request(org: Org) -> None:
    first, _ = submit(org, key="k")
    reordered = dict(reversed(list(job_spec().items())))
    again, created = job_submit(
        user=org.users["alice"], project=org.proj_alpha, payload=reordered, idempotency_key="k"
    )
    assert (again.pk, created) == (first.pk, False)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"replicas": 3}, id="other-replicas"),
        pytest.param({"name": "bert-other"}, id="other-name"),
        pytest.param({"resources": {"gpus": 8}}, id="other-resources"),
    ],
)
def test_same_key_different_body_is_a_conflict_naming_the_key(
    org: Org, change: dict[str, Any]
) -> None:
    first, _ = submit(org, key="nightly-42")
    with pytest.raises(ConflictError, match=r"'nightly-42'.*different request") as info:
        submit(org, key="nightly-42", **change)
    assert f"job {first.pk}" in str(info.value)
    assert list(Job.objects.values_list("pk", flat=True)) == [first.pk]


def test_same_key_same_body_other_project_is_a_conflict(org: Org) -> None:
    submit(org, key="k")
    # alice is a member of team-alpha only; pat (platform admin) may submit anywhere.
    job_submit(
        user=org.users["pat"], project=org.proj_alpha, payload=job_spec(), idempotency_key="pat-k"
    )
    with pytest.raises(ConflictError, match="'pat-k'"):
        job_submit(
            user=org.users["pat"],
            project=org.proj_bravo,
            payload=job_spec(),
            idempotency_key="pat-k",
        )
    assert Job.objects.count() == 2


def test_different_users_may_use_the_same_key(org: Org) -> None:
    alices, _ = submit(org, "alice", key="run-1")
    tinas, created = submit(org, "tina", key="run-1")
    assert created is True
    assert alices.pk != tinas.pk
    assert Job.objects.filter(idempotency_key="run-1").count() == 2


def test_without_a_key_every_submission_is_a_new_job(org: Org) -> None:
    submit(org)
    submit(org)
    assert Job.objects.count() == 2


def test_a_refused_submission_does_not_use_up_the_key(org: Org) -> None:
    with pytest.raises(ValidationError):
        submit(org, key="k", replicas=0)
    job, created = submit(org, key="k")
    assert created is True
    assert Job.objects.get().pk == job.pk


@pytest.mark.parametrize("key", ["", "x" * 129], ids=["empty", "129-chars"])
def test_idempotency_key_length_is_bounded(org: Org, key: str) -> None:
    with pytest.raises(ValidationError) as info:
        submit(org, key=key)
    assert "1-128 characters" in str(info.value.detail["idempotency_key"])
    assert not Job.objects.exists()


@pytest.mark.parametrize("username", ["bob-bravo", "carol", "chris"])
def test_outsiders_cannot_submit_to_team_alpha(org: Org, username: str) -> None:
    with pytest.raises(PermissionDenied, match="proj-alpha"):
        submit(org, username)
    assert not Job.objects.exists()


# --- idempotency under a race -------------------------------------------------------------


def test_two_concurrent_identical_submissions_make_one_job(
    transactional_db: Any,
    org: Org,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Force the bad interleaving: both requests look the key up (and find nothing) before
    # either inserts. Only the unique constraint on (submitted_by, key) can then save us.
    barrier = threading.Barrier(2, timeout=10)
    looked_up = threading.local()
    original = services._existing_for_key

    def lookup_then_wait(user: Any, key: str, fingerprint: str) -> Job | None:
        found = original(user, key, fingerprint)
        if not getattr(looked_up, "done", False):
            looked_up.done = True
            barrier.wait()
        return found

    monkeypatch.setattr(services, "_existing_for_key", lookup_then_wait)

    def call() -> tuple[Job, bool]:
        return submit(org, key="double-click")

    results = run_in_threads(call, call)
    assert [kind for kind, _ in results] == ["ok", "ok"], results
    (job_a, created_a), (job_b, created_b) = (value for _, value in results)
    assert job_a.pk == job_b.pk
    assert sorted([created_a, created_b]) == [False, True]  # one created it, one got it back
    assert Job.objects.count() == 1
    assert JobEvent.objects.filter(kind="submitted").count() == 1


# --- idempotency through the API -----------------------------------------------------------


def test_api_idempotency_key_header(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "spec": job_spec()}
    headers = {"Idempotency-Key": "retry-7"}
    first = client.post(JOBS, body, format="json", headers=headers)
    again = client.post(JOBS, body, format="json", headers=headers)
    assert first.status_code == 201, first.json()
    assert again.status_code == 200, again.json()
    assert again.json()["id"] == first.json()["id"]
    other = {"project": org.proj_alpha.pk, "spec": job_spec(replicas=3)}
    conflict = client.post(JOBS, other, format="json", headers=headers)
    assert conflict.status_code == 409, conflict.json()
    assert "'retry-7'" in conflict.json()["detail"]
    assert Job.objects.count() == 1


def test_api_idempotency_key_in_the_body(org: Org, client_for: Any) -> None:
    client = client_for("alice")
    body = {"project": org.proj_alpha.pk, "idempotency_key": "body-key", "spec": job_spec()}
    first = client.post(JOBS, body, format="json")
    again = client.post(JOBS, body, format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.get().idempotency_key == "body-key"


# --- priority defaults ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("job_type", "expected"),
    [
        # the platform-wide defaults seeded by tenants/migrations/0002
        ("inference", "high"),
        ("training", "normal"),
        ("fine-tuning", "normal"),
        ("interactive", "normal"),
        ("batch", "low"),
        ("evaluation", "low"),
    ],
)
def test_platform_priority_default_by_job_type(org: Org, job_type: str, expected: str) -> None:
    job, _ = submit(org, type=job_type)
    assert job.priority_class.name == expected
    assert job.spec["priority_class"] == expected  # the stored spec says what was applied


def test_named_priority_class_beats_every_default(org: Org) -> None:
    job, _ = submit(org, type="inference", priority_class="best-effort")
    assert job.priority_class.name == "best-effort"


def test_tenant_default_overrides_the_platform_for_its_subtree(org: Org) -> None:
    high, low = PriorityClass.objects.get(name="high"), PriorityClass.objects.get(name="low")
    # dana (research admin) raises training in research; tina (team-alpha admin) lowers it
    # again for team-alpha only. The nearest ancestor's row wins.
    priority_default_set(
        user=org.users["dana"], tenant=org.research, job_type="training", priority_class=high
    )
    priority_default_set(
        user=org.users["tina"], tenant=org.alpha, job_type="training", priority_class=low
    )
    spec = job_spec(type="training")

    def priority_in(project: Any, username: str) -> str:
        job, _ = job_submit(user=org.users[username], project=project, payload=dict(spec))
        return job.priority_class.name

    assert priority_in(org.proj_alpha, "alice") == "low"  # team-alpha's own row
    assert priority_in(org.proj_bravo, "bob-bravo") == "high"  # inherited from research
    assert priority_in(org.proj_charlie, "chris") == "normal"  # product: platform default
    # Other job types in research still follow the platform.
    job, _ = submit(org, type="inference")
    assert job.priority_class.name == "high"
    job, _ = submit(org, type="batch")
    assert job.priority_class.name == "low"


def test_member_cannot_set_a_priority_default(org: Org) -> None:
    with pytest.raises(PermissionDenied, match="team-alpha"):
        priority_default_set(
            user=org.users["alice"],
            tenant=org.alpha,
            job_type="training",
            priority_class=PriorityClass.objects.get(name="critical"),
        )
    job, _ = submit(org)
    assert job.priority_class.name == "normal"
