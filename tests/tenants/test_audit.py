"""The audit log: every audited action leaves exactly one entry with before and after, in the
same transaction; entries cannot be changed or deleted; admins see only their subtrees."""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import Job
from tenants import approvals, selectors, services
from tenants.approval_policies import policy_delete, policy_set
from tenants.approvals import approval_decide, approval_expire_due, quota_request_create
from tenants.audit import audit_record
from tenants.models import (
    ApprovalPolicy,
    ApprovalRequest,
    AuditEntry,
    Membership,
    PriorityClass,
    PriorityDefault,
    Quota,
    ResourceFlavor,
    Tenant,
)
from tenants.quotas.rules import QuotaValues
from tests import factories as f
from tests.conftest import Org, job_spec


@pytest.fixture
def seeded_classes(transactional_db: Any) -> None:
    """Transactional tests truncate every table when they end, the migration-seeded priority
    classes included, and other modules' tests may have done so before: put them back."""
    seed = importlib.import_module("tenants.migrations.0002_seed_priority_classes").seed
    seed(django_apps, None)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(approvals, "enqueue_notification", lambda request_id: None)


def user(org: Org, name: str) -> Any:
    return org.users[name]


def submit(org: Org, name: str = "job-a") -> Job:
    job, _ = job_submit(
        user=user(org, "alice"), project=org.proj_alpha, payload=job_spec(name=name)
    )
    return job


def waiting_job_request(org: Org) -> ApprovalRequest:
    ApprovalPolicy.objects.create(tenant=org.alpha, rule="gpus_over", threshold=4)
    return ApprovalRequest.objects.get(subject_id=submit(org).pk)


def quota_values(guaranteed: int, limit: int) -> QuotaValues:
    return QuotaValues(
        guaranteed_milli=guaranteed, limit_milli=limit, lend_limit_milli=None, weight=1.0
    )


@dataclass
class Case:
    """`act` performs the action as `actor` and returns what `setup` prepared, if needed."""

    action: str
    actor: str | None
    tenant: str | None  # attribute of Org; None for platform-wide entries
    act: Callable[[Org, Any], Any]
    before: dict[str, Any] | None  # a subset of the entry's `before`; None: must be null
    after: dict[str, Any] | None
    setup: Callable[[Org], Any] = lambda org: None
    # other actions the same call records (a quota approval also sets the quota)
    also: dict[str, int] = field(default_factory=dict)


CASES = [
    Case(
        "tenant.create",
        "dana",
        None,
        lambda org, _: services.tenant_create(
            user=user(org, "dana"),
            parent=org.research,
            slug="team-delta",
            name="Delta",
            kind="team",
        ),
        None,
        {"slug": "team-delta", "name": "Delta"},
    ),
    Case(
        "tenant.update",
        "tina",
        "alpha",
        lambda org, _: services.tenant_update(
            user=user(org, "tina"), tenant=org.alpha, name="Alpha Team"
        ),
        {"name": "Team-Alpha"},
        {"name": "Alpha Team"},
    ),
    Case(
        "project.create",
        "tina",
        "alpha",
        lambda org, _: services.project_create(
            user=user(org, "tina"), tenant=org.alpha, slug="proj-new", name="New"
        ),
        None,
        {"slug": "proj-new", "namespace": "proj-new"},
    ),
    Case(
        "project.update",
        "tina",
        "alpha",
        lambda org, _: services.project_update(
            user=user(org, "tina"), project=org.proj_alpha, name="Renamed"
        ),
        {"name": "Proj-Alpha"},
        {"name": "Renamed"},
    ),
    Case(
        "membership.set",
        "tina",
        "alpha",
        lambda org, _: services.membership_set(
            user=user(org, "tina"), tenant=org.alpha, member=user(org, "chris"), role="member"
        ),
        None,
        {"role": "member"},
    ),
    Case(
        "membership.set",
        "tina",
        "alpha",
        lambda org, _: services.membership_set(
            user=user(org, "tina"), tenant=org.alpha, member=user(org, "alice"), role="approver"
        ),
        {"role": "member"},
        {"role": "approver"},
    ),
    Case(
        "membership.delete",
        "tina",
        "alpha",
        lambda org, _: services.membership_delete(
            user=user(org, "tina"),
            membership=Membership.objects.get(user=user(org, "alice"), tenant=org.alpha),
        ),
        {"role": "member"},
        None,
    ),
    Case(
        "flavor.save",
        "pat",
        None,
        lambda org, _: services.flavor_save(
            user=user(org, "pat"), flavor=ResourceFlavor(name="T4", memory_mib=16384)
        ),
        None,
        {"name": "T4", "memory_mib": 16384},
    ),
    Case(
        "flavor.save",
        "pat",
        None,
        lambda org, flavor: services.flavor_save(user=user(org, "pat"), flavor=flavor),
        {"memory_mib": 81920},
        {"memory_mib": 80000},
        setup=lambda org: _changed(ResourceFlavor.objects.get(pk=org.h100.pk), memory_mib=80000),
    ),
    Case(
        "priority_class.save",
        "pat",
        None,
        lambda org, pc: services.priority_class_save(user=user(org, "pat"), priority_class=pc),
        {"description": "Batch and evaluation; gives way first within quota."},
        {"description": "Batch work."},
        setup=lambda org: _changed(
            PriorityClass.objects.get(name="low"), description="Batch work."
        ),
    ),
    Case(
        "priority_default.set",
        "tina",
        "alpha",
        lambda org, _: services.priority_default_set(
            user=user(org, "tina"),
            tenant=org.alpha,
            job_type="training",
            priority_class=PriorityClass.objects.get(name="high"),
        ),
        None,
        {"job_type": "training"},
    ),
    Case(
        "priority_default.delete",
        "tina",
        "alpha",
        lambda org, row: services.priority_default_delete(user=user(org, "tina"), row=row),
        {"job_type": "batch"},
        None,
        setup=lambda org: PriorityDefault.objects.create(
            tenant=org.alpha, job_type="batch", priority_class=f.priority("low")
        ),
    ),
    Case(
        "quota.set",
        "dana",
        "bravo",
        lambda org, _: services.quota_set(
            user=user(org, "dana"),
            tenant=org.bravo,
            flavor=org.h100,
            values=quota_values(12000, 32000),
        ),
        {"guaranteed_milli": 16000, "weight": 1.0},
        {"guaranteed_milli": 12000, "weight": 1.0},
    ),
    Case(
        "quota.delete",
        "pat",
        "charlie",
        lambda org, _: services.quota_delete(
            user=user(org, "pat"), quota=Quota.objects.get(tenant=org.charlie, flavor=org.h100)
        ),
        {"guaranteed_milli": 16000},
        None,
    ),
    Case(
        "policy.set",
        "tina",
        "alpha",
        lambda org, _: policy_set(
            user=user(org, "tina"), tenant=org.alpha, rule="gpus_over", threshold=8
        ),
        None,
        {"rule": "gpus_over", "threshold": 8.0},
    ),
    Case(
        "policy.set",
        "tina",
        "alpha",
        lambda org, p: policy_set(
            user=user(org, "tina"), tenant=org.alpha, policy=p, rule="gpus_over", threshold=16
        ),
        {"threshold": 8.0},
        {"threshold": 16.0},
        setup=lambda org: ApprovalPolicy.objects.create(  # tina's own: she may change it
            tenant=org.alpha, rule="gpus_over", threshold=8, set_at=org.alpha
        ),
    ),
    Case(
        "policy.delete",
        "tina",
        "alpha",
        lambda org, p: policy_delete(user=user(org, "tina"), policy=p),
        {"rule": "borrowing"},
        None,
        setup=lambda org: ApprovalPolicy.objects.create(
            tenant=org.alpha, rule="borrowing", set_at=org.alpha
        ),
    ),
    Case(
        "quota.request",
        "tina",
        "alpha",
        lambda org, _: quota_request_create(
            user=user(org, "tina"),
            tenant=org.alpha,
            flavor=org.h100,
            values=quota_values(16000, 30000),
        ),
        {"limit_milli": 32000},
        {"limit_milli": 30000},
    ),
    Case(
        "approval.decide",
        "tina",
        "alpha",
        lambda org, req: approval_decide(
            user=user(org, "tina"), request=req, approve=True, comment="fine"
        ),
        {"state": "pending"},
        {"state": "approved", "comment": "fine"},
        setup=waiting_job_request,
    ),
    Case(
        "approval.decide",
        "dana",
        "alpha",
        lambda org, req: approval_decide(
            user=user(org, "dana"), request=req, approve=True, comment=""
        ),
        {"state": "pending"},
        {"state": "approved"},
        setup=lambda org: quota_request_create(
            user=user(org, "tina"),
            tenant=org.alpha,
            flavor=org.h100,
            values=quota_values(16000, 30000),
        ),
        also={"quota.set": 1},
    ),
    Case(
        "approval.expire",
        None,
        "alpha",
        lambda org, req: approval_expire_due(timezone.now() + timedelta(days=365)),
        {"state": "pending"},
        {"state": "expired"},
        setup=waiting_job_request,
    ),
    Case(
        "job.submit",
        "alice",
        "alpha",
        lambda org, _: submit(org, "job-new"),
        None,
        {"name": "job-new", "state": "queued", "replicas": 2},
    ),
    Case(
        "job.cancel",
        "alice",
        "alpha",
        lambda org, job: job_cancel(user=user(org, "alice"), job=job),
        {"state": "queued"},
        {"state": "cancelled"},
        setup=lambda org: submit(org, "job-old"),
    ),
]


def _changed(obj: Any, **fields: Any) -> Any:
    for key, value in fields.items():
        setattr(obj, key, value)
    return obj


def _case_id(case: Case) -> str:
    return f"{case.action}-{'update' if case.before else 'create'}"


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_each_audited_action_leaves_exactly_one_entry(org: Org, case: Case) -> None:
    prepared = case.setup(org)
    first_new = (AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
    case.act(org, prepared)
    new = list(AuditEntry.objects.filter(id__gte=first_new))
    assert Counter(e.action for e in new) == Counter({case.action: 1, **case.also})
    entry = next(e for e in new if e.action == case.action)
    expected_actor = user(org, case.actor) if case.actor else None
    assert (entry.actor, entry.actor_name) == (expected_actor, case.actor or "")
    if case.tenant is not None:
        assert entry.tenant == getattr(org, case.tenant)
    elif case.action == "tenant.create":
        assert entry.tenant == Tenant.objects.get(slug="team-delta")
    else:
        assert entry.tenant is None
    for expected, actual in [(case.before, entry.before), (case.after, entry.after)]:
        if expected is None:
            assert actual is None
        else:
            assert actual is not None and {k: actual.get(k) for k in expected} == expected
    assert entry.target_type and entry.target_id


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            lambda org: services.quota_set(
                user=user(org, "dana"),
                tenant=org.bravo,
                flavor=org.h100,
                values=quota_values(40000, 40000),
            ),
            ValidationError,
        ),
        (
            lambda org: services.quota_set(
                user=user(org, "tina"),
                tenant=org.alpha,
                flavor=org.h100,
                values=quota_values(1000, 1000),
            ),
            PermissionDenied,
        ),
        (
            lambda org: services.membership_set(
                user=user(org, "alice"), tenant=org.alpha, member=user(org, "chris"), role="admin"
            ),
            PermissionDenied,
        ),
        (
            lambda org: policy_set(user=user(org, "tina"), tenant=org.alpha, rule="gpus_over"),
            ValidationError,
        ),
    ],
    ids=["quota-over-parent", "quota-by-team-admin", "membership-by-member", "policy-invalid"],
)
def test_a_refused_change_leaves_no_entry(
    org: Org, call: Callable[[Org], Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        call(org)
    assert not AuditEntry.objects.exists()


def test_an_idempotent_repeat_leaves_no_second_entry(org: Org) -> None:
    for _ in range(2):
        job_submit(
            user=user(org, "alice"),
            project=org.proj_alpha,
            payload=job_spec(),
            idempotency_key="k1",
        )
    assert AuditEntry.objects.filter(action="job.submit").count() == 1


def test_audit_record_refuses_to_run_outside_a_transaction(
    transactional_db: Any, seeded_classes: None, org: Org
) -> None:
    with pytest.raises(RuntimeError, match="inside the change's transaction"):
        audit_record(
            actor=None, action="x.y", tenant=None, target=("x", 1), before=None, after=None
        )
    assert not AuditEntry.objects.exists()


# --- immutability ---------------------------------------------------------------------------


@pytest.fixture
def entry(org: Org) -> AuditEntry:
    services.quota_set(
        user=user(org, "dana"), tenant=org.bravo, flavor=org.h100, values=quota_values(12000, 32000)
    )
    return AuditEntry.objects.get(action="quota.set")


def _postgres_only() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the append-only trigger exists on PostgreSQL only")


@pytest.mark.parametrize(
    "change",
    [
        lambda e: AuditEntry.objects.filter(pk=e.pk).update(action="quota.nothing"),
        lambda e: AuditEntry.objects.filter(pk=e.pk).update(after=None),
        lambda e: (setattr(e, "actor_name", "someone-else"), e.save()),
        lambda e: AuditEntry.objects.filter(pk=e.pk).delete(),
        lambda e: e.delete(),
        lambda e: connection.cursor().execute(
            "DELETE FROM tenants_auditentry WHERE id = %s", [e.pk]
        ),
    ],
    ids=["update-action", "update-after", "save", "queryset-delete", "delete", "raw-delete"],
)
def test_entries_cannot_be_updated_or_deleted(entry: AuditEntry, change: Any) -> None:
    _postgres_only()
    original = AuditEntry.objects.filter(pk=entry.pk).values().get()
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        change(entry)
    assert AuditEntry.objects.filter(pk=entry.pk).values().get() == original


def test_the_trigger_is_installed(db: Any) -> None:
    _postgres_only()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE tgrelid = 'tenants_auditentry'::regclass"
            " AND NOT tgisinternal"
        )
        assert [row[0] for row in cursor.fetchall()] == ["tenants_auditentry_append_only"]


# --- who sees which entries ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("persona", "visible"),
    [
        ("alice", set()),  # a member sees none, not even their own team's
        ("bob-bravo", set()),
        ("chris", set()),
        ("tina", {"team-alpha"}),  # admin of team-alpha
        ("dana", {"team-alpha", "team-bravo"}),  # admin of research
        ("carol", {"team-alpha", "team-bravo", "team-charlie", None}),  # finance: all
        ("pat", {"team-alpha", "team-bravo", "team-charlie", None}),
    ],
)
def test_audit_visibility(org: Org, persona: str, visible: set[str | None]) -> None:
    services.project_create(user=user(org, "tina"), tenant=org.alpha, slug="p1", name="P1")
    services.quota_set(
        user=user(org, "dana"), tenant=org.bravo, flavor=org.h100, values=quota_values(12000, 32000)
    )
    services.membership_set(
        user=user(org, "pat"), tenant=org.charlie, member=user(org, "alice"), role="member"
    )
    services.flavor_save(user=user(org, "pat"), flavor=ResourceFlavor(name="T4", memory_mib=1))
    rows = selectors.audit_list_visible(user(org, persona))
    assert {e.tenant.slug if e.tenant else None for e in rows} == visible
