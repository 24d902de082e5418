"""Approvals: rules, decisions, the approval race, expiry, quota requests
(docs/faults.md 10, 19, 28)."""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.core import mail
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from common.errors import ConflictError
from scheduler.jobs import approvals as scheduler_approvals
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import Job, JobEvent, JobState
from tenants import approvals, selectors
from tenants.approval_policies import policy_set
from tenants.approval_rules import job_matches
from tenants.approvals import (
    approval_decide,
    approval_expire_due,
    quota_request_create,
    register_subject_handler,
)
from tenants.approvals import enqueue_notification as real_enqueue_notification
from tenants.models import (
    ApprovalKind,
    ApprovalPolicy,
    ApprovalRequest,
    ApprovalState,
    AuditEntry,
    PriorityClass,
    Quota,
)
from tenants.notifications import approval_notification_send
from tenants.quotas.rules import QuotaValues
from tests import factories as f
from tests.concurrency import rendezvous, run_in_threads
from tests.conftest import Org, job_spec

HOUR = 3600


@pytest.fixture
def seeded_classes(transactional_db: Any) -> None:
    """Transactional tests truncate every table when they end, the migration-seeded priority
    classes included, and other modules' tests may have done so before: put them back."""
    seed = importlib.import_module("tenants.migrations.0002_seed_priority_classes").seed
    seed(django_apps, None)


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Notifications that would be queued, captured instead of sent to a broker."""
    queued: list[int] = []
    monkeypatch.setattr(approvals, "enqueue_notification", queued.append)
    return queued


def policy(org: Org, rule: str, tenant: Any = None, **fields: Any) -> ApprovalPolicy:
    return ApprovalPolicy.objects.create(tenant=tenant or org.alpha, rule=rule, **fields)


def submit(org: Org, username: str = "alice", **spec: Any) -> Job:
    job, _ = job_submit(user=org.users[username], project=org.proj_alpha, payload=job_spec(**spec))
    return job


def request_of(job: Job) -> ApprovalRequest:
    return ApprovalRequest.objects.get(kind="job", subject_id=job.pk)


# --- rules, table-driven ------------------------------------------------------------------

BASE = {
    "gpus_milli": 8000,
    "est_gpu_hours": 10.0,
    "priority_value": 500,
    "borrowing": False,
    "runtime_hours": 5.0,
}


@pytest.mark.parametrize(
    ("rule", "policy_fields", "job", "matches"),
    [
        # gpus_over 8: exactly 8 GPUs is not over; 8.001 is
        ("gpus_over", {"threshold": 8}, {"gpus_milli": 8000}, False),
        ("gpus_over", {"threshold": 8}, {"gpus_milli": 8001}, True),
        ("gpus_over", {"threshold": 0.5}, {"gpus_milli": 500}, False),
        ("gpus_over", {"threshold": 0.5}, {"gpus_milli": 750}, True),
        # gpu_hours_over 100
        ("gpu_hours_over", {"threshold": 100}, {"est_gpu_hours": 100.0}, False),
        ("gpu_hours_over", {"threshold": 100}, {"est_gpu_hours": 100.5}, True),
        ("gpu_hours_over", {"threshold": 100}, {"est_gpu_hours": None}, True),  # unbounded
        # priority_at_least high (800)
        ("priority_at_least", {"priority_class": "high"}, {"priority_value": 800}, True),
        ("priority_at_least", {"priority_class": "high"}, {"priority_value": 1000}, True),
        ("priority_at_least", {"priority_class": "high"}, {"priority_value": 500}, False),
        ("borrowing", {}, {"borrowing": True}, True),
        ("borrowing", {}, {"borrowing": False}, False),
        # runtime_over_hours 24
        ("runtime_over_hours", {"threshold": 24}, {"runtime_hours": 24.0}, False),
        ("runtime_over_hours", {"threshold": 24}, {"runtime_hours": 24.5}, True),
        ("runtime_over_hours", {"threshold": 24}, {"runtime_hours": None}, True),  # no limit
    ],
    ids=lambda v: str(v) if not isinstance(v, dict) else ",".join(f"{k}={x}" for k, x in v.items()),
)
def test_each_rule_kind(
    org: Org, rule: str, policy_fields: dict[str, Any], job: dict[str, Any], matches: bool
) -> None:
    fields = dict(policy_fields)
    if "priority_class" in fields:
        fields["priority_class"] = PriorityClass.objects.get(name=fields["priority_class"])
    policy(org, rule, **fields)
    reasons = [m.reason for m in job_matches(tenant=org.alpha, **{**BASE, **job})]
    assert bool(reasons) is matches, reasons
    if matches:
        assert "team-alpha" in reasons[0]  # the reason names the policy's tenant
        # The email says "It needed approval because it <reason>": each reason is a clause
        # with its verb ("it priority 1000" was a sentence without one).
        assert reasons[0].split()[0] in {"asks", "has", "may", "would"}, reasons[0]


@pytest.mark.parametrize(
    ("where", "active", "jobs", "matches"),
    [
        ("alpha", True, True, True),
        ("research", True, True, True),  # an ancestor's policy applies below it
        ("acme", True, True, True),
        ("bravo", True, True, False),  # a sibling's does not
        ("alpha", False, True, False),  # inactive
        ("alpha", True, False, False),  # quota requests only
    ],
)
def test_which_policies_apply(
    org: Org, where: str, active: bool, jobs: bool, matches: bool
) -> None:
    policy(
        org,
        "gpus_over",
        tenant=getattr(org, where),
        threshold=1,
        active=active,
        applies_to_jobs=jobs,
        applies_to_quota=not jobs,
    )
    job = submit(org)  # 2 x 4 GPUs
    assert (job.state == JobState.PENDING_APPROVAL) is matches, job.reason
    assert ApprovalRequest.objects.filter(subject_id=job.pk).exists() is matches


@pytest.mark.parametrize(
    ("spec", "threshold", "pending"),
    [
        # max_runtime 5 h -> 2 replicas x 4 GPUs x 5 h = 40 GPU-hours
        ({"max_runtime_s": 5 * HOUR}, 39, True),
        ({"max_runtime_s": 5 * HOUR}, 40, False),
        # a short estimate does not dodge the rule: 2 x 4 x 50 h = 400, not 2 x 4 x 1 h = 8
        ({"max_runtime_s": 50 * HOUR, "estimated_runtime_s": HOUR}, 8, True),
        ({"max_runtime_s": 50 * HOUR, "estimated_runtime_s": HOUR}, 400, False),
        # an estimate without a max runtime bounds nothing: unbounded GPU-hours
        ({"estimated_runtime_s": HOUR}, 1000, True),
    ],
    ids=["max-over", "max-within", "short-estimate", "max-within-2", "estimate-only"],
)
def test_gpu_hours_rule_uses_the_enforced_max_runtime_not_the_estimate(
    org: Org, spec: dict[str, Any], threshold: int, pending: bool
) -> None:
    policy(org, "gpu_hours_over", threshold=threshold)
    job = submit(org, **spec)
    assert (job.state == JobState.PENDING_APPROVAL) is pending
    assert ApprovalRequest.objects.filter(subject_id=job.pk).exists() is pending


@pytest.mark.parametrize(
    ("spec", "pending"),
    [
        ({"max_runtime_s": 24 * HOUR}, False),
        ({"max_runtime_s": 25 * HOUR}, True),
        # the estimate says 1 h, but nothing stops the job before its 72 h maximum
        ({"max_runtime_s": 72 * HOUR, "estimated_runtime_s": HOUR}, True),
        ({"estimated_runtime_s": HOUR}, True),  # no maximum: unbounded
    ],
    ids=["max-within", "max-over", "short-estimate", "estimate-only"],
)
def test_runtime_rule_uses_the_enforced_max_runtime_not_the_estimate(
    org: Org, spec: dict[str, Any], pending: bool
) -> None:
    policy(org, "runtime_over_hours", threshold=24)
    job = submit(org, **spec)
    assert (job.state == JobState.PENDING_APPROVAL) is pending, job.reason


@pytest.mark.parametrize(("running_gpus", "pending"), [(0, False), (8, False), (9, True)])
def test_submit_detects_borrowing(org: Org, running_gpus: int, pending: bool) -> None:
    # team-alpha is guaranteed 16 H100; the new job asks for 2 x 4 = 8.
    policy(org, "borrowing")
    if running_gpus:
        f.JobFactory(
            project=org.proj_alpha,
            state=JobState.RUNNING,
            replicas=1,
            gpus_per_replica=running_gpus,
            gpu_milli_per_replica=running_gpus * 1000,
            flavors=["H100-80GB"],
        )
    job = submit(org)
    assert (job.state == JobState.PENDING_APPROVAL) is pending, job.reason
    rules = [r["rule"] for r in request_of(job).rules] if pending else []
    assert rules == (["borrowing"] if pending else [])
    assert ApprovalRequest.objects.filter(subject_id=job.pk).exists() is pending


def eight_gpu_guarantee(org: Org) -> None:
    """The issue's case: team-alpha guaranteed 8 H100 (limit 80), a borrowing policy."""
    Quota.objects.filter(tenant=org.alpha, flavor=org.h100).update(
        guaranteed_milli=8000, limit_milli=80000
    )
    policy(org, "borrowing")


def eight_gpus() -> dict[str, Any]:
    return {"replicas": 1, "resources": {"gpus": 8, "cpu_milli": 8000, "memory_mib": 65536}}


def test_borrowing_rule_counts_queued_jobs(org: Org) -> None:
    # Ten 8-GPU jobs at once against an 8-GPU guarantee: the first fits (8 <= 8), each of
    # the other nine would borrow (16, 24, ... 80 > 8), so nine wait for approval.
    eight_gpu_guarantee(org)
    jobs = [submit(org, name=f"job-{i}", **eight_gpus()) for i in range(10)]
    states = [job.state for job in jobs]
    assert states == [JobState.QUEUED] + [JobState.PENDING_APPROVAL] * 9
    assert ApprovalRequest.objects.filter(kind="job").count() == 9
    assert "beyond its guaranteed quota" in jobs[1].reason


@pytest.mark.parametrize(
    ("state", "counts"),
    [
        (JobState.QUEUED, True),
        (JobState.ADMITTED, True),
        (JobState.BINDING, True),
        (JobState.RUNNING, True),
        (JobState.PREEMPTED, True),  # returns to the queue
        (JobState.PENDING_APPROVAL, False),  # its borrowing is decided with it
        (JobState.SUCCEEDED, False),
        (JobState.CANCELLED, False),
    ],
)
def test_borrowing_rule_counts_every_claiming_state(org: Org, state: str, counts: bool) -> None:
    eight_gpu_guarantee(org)
    f.JobFactory(
        project=org.proj_alpha,
        state=state,
        replicas=1,
        gpus_per_replica=8,
        gpu_milli_per_replica=8000,
        flavors=["H100-80GB"],
    )
    job = submit(org, **eight_gpus())
    assert (job.state == JobState.PENDING_APPROVAL) is counts, job.reason


def test_borrowing_rule_ignores_best_effort_jobs(org: Org) -> None:
    # best-effort runs on idle capacity and is not charged to the guarantee
    eight_gpu_guarantee(org)
    f.JobFactory(
        project=org.proj_alpha,
        state=JobState.QUEUED,
        replicas=1,
        gpus_per_replica=8,
        gpu_milli_per_replica=8000,
        flavors=["H100-80GB"],
        priority_class=PriorityClass.objects.get(counts_against_quota=False),
    )
    assert submit(org, **eight_gpus()).state == JobState.QUEUED


def test_borrowing_rule_counts_a_running_job_on_its_allocations_flavor_only(
    org: Org, settings: Any
) -> None:
    # alpha holds 8 A100 and 16 H100; a job that allows both runs 16 H100. An 8-GPU A100 job
    # is within alpha's A100 guarantee: the running job holds no A100 (it was counted
    # against every flavor it allows, and the new job waited for approval).
    settings.GANTRY_REFUSE_BEYOND_INVENTORY = False  # the nodes here have no devices
    for tenant in (org.acme, org.research, org.alpha):
        f.QuotaFactory(tenant=tenant, flavor=org.a100, guaranteed_milli=8000, limit_milli=8000)
    policy(org, "borrowing")
    running = f.JobFactory(
        project=org.proj_alpha,
        state=JobState.RUNNING,
        replicas=2,
        gpus_per_replica=8,
        gpu_milli_per_replica=8000,
        flavors=["A100-40GB", "H100-80GB"],
    )
    f.place(running, f.NodeFactory(flavor="H100-80GB"))
    a100 = submit(org, name="on-a100", flavors=["A100-40GB"], **eight_gpus())
    assert a100.state == JobState.QUEUED, a100.reason
    h100 = submit(org, name="on-h100", **eight_gpus())  # 16 + 8 of 16 H100
    assert h100.state == JobState.PENDING_APPROVAL, h100.reason


def test_borrowing_rule_counts_the_teams_subtree_as_the_engine_does(
    org: Org, settings: Any
) -> None:
    # research's guarantee covers its teams: with bravo running 16 of it, research's own
    # 8-GPU job takes research to 24 of 32 (within), and a second one to 32 (within), a
    # third beyond. Counting research's own jobs alone would miss bravo's 16.
    settings.GANTRY_REFUSE_BEYOND_INVENTORY = False  # the nodes here have no devices
    policy(org, "borrowing", tenant=org.research)
    project = f.ProjectFactory(tenant=org.research, slug="proj-research")
    running = f.JobFactory(
        project=org.proj_bravo,
        state=JobState.RUNNING,
        replicas=2,
        gpus_per_replica=8,
        gpu_milli_per_replica=8000,
        flavors=["H100-80GB"],
    )
    f.place(running)
    f.MembershipFactory(user=org.users["alice"], tenant=org.research, role="member")
    states = [
        job_submit(
            user=org.users["alice"],
            project=project,
            payload=job_spec(name=f"r-{i}", **eight_gpus()),
        )[0].state
        for i in range(3)
    ]
    assert states == [JobState.QUEUED, JobState.QUEUED, JobState.PENDING_APPROVAL]


@pytest.mark.postgresql("row locks: SQLite serialises writers on its database lock")
def test_borrowing_rule_holds_for_jobs_submitted_at_the_same_moment(
    transactional_db: Any, seeded_classes: None, org: Org, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forced interleaving: job-a has judged its borrowing and holds its transaction open
    # until job-b has judged its own, or is seen blocked on a lock. Without the tenant's row
    # lock job-b reads no job-a (uncommitted) and is queued beside it: 16 of 8 without
    # approval. With it, job-b waits for job-a's commit, sees it and asks for approval.
    eight_gpu_guarantee(org)
    a_judged, b_entered, b_judged = threading.Event(), threading.Event(), threading.Event()
    real = scheduler_approvals.job_borrows

    def b_blocked() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock' AND datname = current_database()"
            )
            return bool(cursor.fetchone()[0])

    def judged_in_turn(job: Job, **kw: Any) -> bool:
        if job.name == "job-b":
            b_entered.set()
            try:
                return real(job, **kw)
            finally:
                b_judged.set()
        borrows = real(job, **kw)
        a_judged.set()
        assert b_entered.wait(10), "job-b never started"
        while not b_judged.wait(0.01) and not b_blocked():
            pass
        return borrows

    monkeypatch.setattr(scheduler_approvals, "job_borrows", judged_in_turn)
    results = run_in_threads(
        lambda: submit(org, name="job-a", **eight_gpus()),
        lambda: a_judged.wait(10) and submit(org, name="job-b", **eight_gpus()),
    )
    assert all(kind == "ok" for kind, _ in results), results
    states = dict(Job.objects.values_list("name", "state"))
    assert states == {"job-a": JobState.QUEUED, "job-b": JobState.PENDING_APPROVAL}


def test_a_job_needing_approval_waits_with_its_reasons(org: Org) -> None:
    policy(org, "gpus_over", threshold=4)
    job = submit(org)
    assert job.state == JobState.PENDING_APPROVAL
    assert job.queued_at is None
    request = request_of(job)
    assert request.state == ApprovalState.PENDING
    assert request.requester == org.users["alice"]
    assert request.reasons == ["asks for 8 GPUs (policy of 'team-alpha': GPUs over 4)"]
    assert request.payload["job_name"] == "bert-pretrain"
    assert "waiting for approval" in job.reason


def test_a_job_without_matching_policy_is_queued(org: Org) -> None:
    policy(org, "gpus_over", threshold=8)
    job = submit(org)
    assert job.state == JobState.QUEUED
    assert not ApprovalRequest.objects.exists()


# --- deciding ------------------------------------------------------------------------------


@pytest.fixture
def pending_job(org: Org) -> Job:
    policy(org, "gpus_over", threshold=4)
    return submit(org)


def test_approve_queues_the_job(org: Org, pending_job: Job) -> None:
    request = approval_decide(
        user=org.users["tina"], request=request_of(pending_job), approve=True, comment="go ahead"
    )
    pending_job.refresh_from_db()
    assert pending_job.state == JobState.QUEUED
    assert pending_job.queued_at is not None and pending_job.reason == ""
    assert (request.state, request.decided_by, request.comment) == (
        ApprovalState.APPROVED,
        org.users["tina"],
        "go ahead",
    )
    assert JobEvent.objects.filter(job=pending_job, kind="approved").count() == 1


def test_reject_rejects_the_job(org: Org, pending_job: Job) -> None:
    approval_decide(
        user=org.users["dana"], request=request_of(pending_job), approve=False, comment="too big"
    )
    pending_job.refresh_from_db()
    assert pending_job.state == JobState.REJECTED
    assert pending_job.reason == "rejected by dana: too big"


JOB_UPDATE = re.compile(r'\bUPDATE\s+"?scheduler_job"?\s', re.IGNORECASE)


@pytest.mark.parametrize(
    ("approve", "state", "reason"),
    [(True, JobState.QUEUED, ""), (False, JobState.REJECTED, "rejected by dana: too big")],
    ids=["approve", "reject"],
)
def test_settling_a_job_request_writes_its_state_and_reason_in_one_update(
    org: Org, pending_job: Job, approve: bool, state: str, reason: str
) -> None:
    # The reason goes with the transition, not in a second write after it (which a reader
    # between the two saw as the new state with the old reason).
    with CaptureQueriesContext(connection) as queries:
        approval_decide(
            user=org.users["dana"],
            request=request_of(pending_job),
            approve=approve,
            comment="too big",
        )
    updates = [q["sql"] for q in queries.captured_queries if JOB_UPDATE.search(q["sql"])]
    assert len(updates) == 1, updates
    pending_job.refresh_from_db()
    assert (pending_job.state, pending_job.reason) == (state, reason)


def test_tenants_decide_works_for_job_requests_too(org: Org, pending_job: Job) -> None:
    approval_decide(
        user=org.users["tina"], request=request_of(pending_job), approve=True, comment=""
    )
    pending_job.refresh_from_db()
    assert pending_job.state == JobState.QUEUED


def test_nobody_approves_their_own_request(org: Org) -> None:
    policy(org, "gpus_over", threshold=4)
    job = submit(org, "tina")  # tina is an admin of team-alpha: she could approve others'
    with pytest.raises(PermissionDenied, match="your own request"):
        approval_decide(user=org.users["tina"], request=request_of(job), approve=True, comment="")
    assert request_of(job).state == ApprovalState.PENDING
    assert not selectors.approval_list_inbox(org.users["tina"]).exists()
    assert list(selectors.approval_list_inbox(org.users["dana"])) == [request_of(job)]


def test_the_database_refuses_a_self_decision(org: Org, pending_job: Job) -> None:
    with pytest.raises(IntegrityError):
        ApprovalRequest.objects.filter(subject_id=pending_job.pk).update(
            state=ApprovalState.APPROVED, decided_by=org.users["alice"], decided_at=timezone.now()
        )


def test_the_database_refuses_a_decision_without_decider(org: Org, pending_job: Job) -> None:
    with pytest.raises(IntegrityError):
        ApprovalRequest.objects.filter(subject_id=pending_job.pk).update(
            state=ApprovalState.APPROVED
        )


@pytest.mark.parametrize(
    ("username", "role_on_alpha", "may"),
    [
        ("alice-2", "member", False),
        ("lead", "approver", True),
        ("tina", None, True),  # admin of team-alpha
        ("dana", None, True),  # admin of research, above
        ("chris", None, False),  # member of another team
        ("carol", None, False),  # finance reads but decides nothing
        ("pat", None, True),  # platform admin
    ],
)
def test_who_may_decide_a_job_request(
    org: Org, pending_job: Job, username: str, role_on_alpha: str | None, may: bool
) -> None:
    user = org.users.get(username) or f.UserFactory(username=username)
    if role_on_alpha:
        f.MembershipFactory(user=user, tenant=org.alpha, role=role_on_alpha)
    request = request_of(pending_job)
    assert selectors.approval_list_inbox(user).filter(pk=request.pk).exists() is may
    if may:
        approval_decide(user=user, request=request, approve=True, comment="")
        assert request_of(pending_job).state == ApprovalState.APPROVED
    else:
        with pytest.raises(PermissionDenied):
            approval_decide(user=user, request=request, approve=True, comment="")
        assert request_of(pending_job).state == ApprovalState.PENDING


def test_a_second_decision_is_a_conflict(org: Org, pending_job: Job) -> None:
    request = request_of(pending_job)
    approval_decide(user=org.users["tina"], request=request, approve=True, comment="")
    stale = ApprovalRequest.objects.get(pk=request.pk)
    with pytest.raises(ConflictError, match="already approved by tina"):
        approval_decide(user=org.users["dana"], request=stale, approve=False, comment="")
    pending_job.refresh_from_db()
    assert pending_job.state == JobState.QUEUED


def test_cancelling_a_waiting_job_withdraws_its_request(org: Org, pending_job: Job) -> None:
    job_cancel(user=org.users["alice"], job=pending_job)
    request = request_of(pending_job)
    assert request.state == ApprovalState.CANCELLED
    with pytest.raises(ConflictError):
        approval_decide(user=org.users["tina"], request=request, approve=True, comment="")
    pending_job.refresh_from_db()
    assert pending_job.state == JobState.CANCELLED


def test_a_comment_with_control_characters_is_refused(org: Org, pending_job: Job) -> None:
    with pytest.raises(ValidationError):
        approval_decide(
            user=org.users["tina"],
            request=request_of(pending_job),
            approve=True,
            comment="ok\x1b[31m",
        )
    assert request_of(pending_job).state == ApprovalState.PENDING


def test_policy_set_refuses_a_member_and_explains_missing_arguments(org: Org) -> None:
    with pytest.raises(PermissionDenied):
        policy_set(user=org.users["alice"], tenant=org.alpha, rule="gpus_over", threshold=1)
    with pytest.raises(ValidationError) as err:
        policy_set(user=org.users["tina"], tenant=org.alpha, rule="gpus_over")
    assert "needs a threshold" in str(err.value)
    with pytest.raises(ValidationError):
        policy_set(user=org.users["tina"], tenant=org.alpha, rule="priority_at_least")
    assert not ApprovalPolicy.objects.exists()


# --- the approval race (docs/faults.md 19) --------------------------------------------------------


def wait_after_checks(monkeypatch: pytest.MonkeyPatch, parties: int) -> None:
    """Hold every decider after its checks passed (it saw the request pending) until all are
    there: the interleaving where a check-then-write would let both decisions land."""
    meet = rendezvous(parties)
    original = approvals._check_comment

    def check_then_wait(text: str, name: str = "comment") -> None:
        original(text, name)
        if name == "comment":
            meet()

    monkeypatch.setattr(approvals, "_check_comment", check_then_wait)


@pytest.mark.parametrize(
    ("tina_approves", "dana_approves"),
    [(True, True), (True, False), (False, False)],
    ids=["both-approve", "approve-and-reject", "both-reject"],
)
def test_two_approvers_at_once_make_exactly_one_decision(
    transactional_db: Any,
    seeded_classes: None,
    org: Org,
    monkeypatch: pytest.MonkeyPatch,
    tina_approves: bool,
    dana_approves: bool,
) -> None:
    policy(org, "gpus_over", threshold=4)
    job = submit(org)
    wait_after_checks(monkeypatch, 2)

    def decide(username: str, approve: bool) -> ApprovalRequest:
        request = ApprovalRequest.objects.get(subject_id=job.pk)
        return approval_decide(
            user=org.users[username], request=request, approve=approve, comment=username
        )

    results = run_in_threads(
        lambda: decide("tina", tina_approves), lambda: decide("dana", dana_approves)
    )
    kinds = sorted(kind for kind, _ in results)
    assert kinds == ["error", "ok"], results
    loser = next(value for kind, value in results if kind == "error")
    assert isinstance(loser, ConflictError)
    winner = next(value for kind, value in results if kind == "ok")
    job.refresh_from_db()
    assert job.state == (
        JobState.QUEUED if winner.state == ApprovalState.APPROVED else JobState.REJECTED
    )
    assert AuditEntry.objects.filter(action="approval.decide").count() == 1
    assert JobEvent.objects.filter(job=job, kind__in=["approved", "rejected"]).count() == 1


# --- expiry (docs/faults.md 10) -------------------------------------------------------------------


def test_expiry_rejects_the_job_once(org: Org, settings: Any, no_broker: list[int]) -> None:
    settings.GANTRY_APPROVAL_TTL_HOURS = 2
    policy(org, "gpus_over", threshold=4)
    job = submit(org)
    now = timezone.now()
    assert approval_expire_due(now + timedelta(hours=1)) == 0  # not yet
    assert approval_expire_due(now + timedelta(hours=3)) == 1
    assert approval_expire_due(now + timedelta(hours=3)) == 0  # a second beat: nothing
    job.refresh_from_db()
    assert (job.state, job.reason) == (JobState.REJECTED, "approval expired")
    request = request_of(job)
    assert request.state == ApprovalState.EXPIRED and request.decided_by is None
    assert AuditEntry.objects.filter(action="approval.expire").count() == 1


def test_an_expired_request_cannot_be_approved(org: Org, settings: Any) -> None:
    settings.GANTRY_APPROVAL_TTL_HOURS = 1
    policy(org, "gpus_over", threshold=4)
    job = submit(org)
    ApprovalRequest.objects.filter(subject_id=job.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    with pytest.raises(ConflictError, match="expired"):
        approval_decide(user=org.users["tina"], request=request_of(job), approve=True, comment="")
    assert not selectors.approval_list_inbox(org.users["tina"]).exists()


def test_two_beats_expire_each_request_once(
    transactional_db: Any,
    seeded_classes: None,
    org: Org,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy(org, "gpus_over", threshold=4)
    jobs = [submit(org, name=f"big-{i}") for i in range(3)]
    later = timezone.now() + timedelta(days=30)
    # Both beats list the due requests before either expires one.
    barrier = threading.Barrier(2, timeout=10)
    original = approvals._expire_one
    waited = threading.local()

    def list_then_wait(pk: int, now: Any) -> bool:
        if not getattr(waited, "done", False):
            waited.done = True
            barrier.wait()
        return original(pk, now)

    monkeypatch.setattr(approvals, "_expire_one", list_then_wait)
    results = run_in_threads(lambda: approval_expire_due(later), lambda: approval_expire_due(later))
    assert [kind for kind, _ in results] == ["ok", "ok"], results
    assert sum(value for _, value in results) == 3
    assert AuditEntry.objects.filter(action="approval.expire").count() == 3
    for job in jobs:
        job.refresh_from_db()
        assert job.state == JobState.REJECTED
        assert JobEvent.objects.filter(job=job, to_state=JobState.REJECTED).count() == 1


# --- notifications (docs/faults.md 9) -------------------------------------------------------------


def test_decision_queues_one_notification_and_sends_one_email(
    org: Org, pending_job: Job, no_broker: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    request = request_of(pending_job)
    with django_capture_on_commit_callbacks(execute=True):
        approval_decide(user=org.users["tina"], request=request, approve=False, comment="no")
    assert no_broker == [request.pk]
    assert approval_notification_send(request.pk) is True
    assert approval_notification_send(request.pk) is False  # delivered twice: one email
    assert len(mail.outbox) == 1
    message = mail.outbox[0]
    assert message.to == ["alice@example.com"]
    assert "rejected" in message.subject and "Comment: no" in message.body


def test_a_pending_request_sends_nothing(org: Org, pending_job: Job) -> None:
    assert approval_notification_send(request_of(pending_job).pk) is False
    assert mail.outbox == []


# --- quota requests (docs/faults.md 19) -----------------------------------------------------------


@pytest.fixture
def tight_research(org: Org) -> Org:
    """research guarantees 32 H100; alpha and bravo 12 each: 8 left to share."""
    Quota.objects.filter(tenant__in=[org.alpha, org.bravo], flavor=org.h100).update(
        guaranteed_milli=12000
    )
    org.users["bea-bravo"] = f.UserFactory(username="bea-bravo")
    f.MembershipFactory(user=org.users["bea-bravo"], tenant=org.bravo, role="admin")
    return org


def ask(org: Org, username: str, tenant: Any, guaranteed: int) -> ApprovalRequest:
    values = QuotaValues(
        guaranteed_milli=guaranteed * 1000, limit_milli=32000, lend_limit_milli=None, weight=1.0
    )
    return quota_request_create(
        user=org.users[username],
        tenant=tenant,
        flavor=org.h100,
        values=values,
        justification="new project",
    )


def guaranteed(org: Org, tenant: Any) -> int:
    return Quota.objects.get(tenant=tenant, flavor=org.h100).guaranteed_milli // 1000


def test_approving_a_quota_request_applies_it(tight_research: Org) -> None:
    org = tight_research
    request = ask(org, "tina", org.alpha, 18)
    assert request.state == ApprovalState.PENDING and guaranteed(org, org.alpha) == 12
    approval_decide(user=org.users["dana"], request=request, approve=True, comment="ok")
    assert guaranteed(org, org.alpha) == 18
    assert AuditEntry.objects.filter(action="quota.set", tenant=org.alpha).count() == 1


def test_a_quota_request_asks_its_deciders_in_words(tight_research: Org) -> None:
    request = ask(tight_research, "tina", tight_research.alpha, 14)
    text = approvals.approval_needed_event(request).text
    assert text.startswith("Approval needed: tina asks for a quota change for H100")
    assert "in 'team-alpha'. http" in text


def test_quota_requests_are_made_by_admins_and_decided_above(tight_research: Org) -> None:
    org = tight_research
    with pytest.raises(PermissionDenied):
        ask(org, "alice", org.alpha, 14)  # a member
    request = ask(org, "tina", org.alpha, 14)
    lead = f.UserFactory(username="alpha-lead")
    f.MembershipFactory(user=lead, tenant=org.alpha, role="admin")
    for user in [org.users["tina"], lead]:  # the requester; an admin of the team itself
        with pytest.raises(PermissionDenied):
            approval_decide(user=user, request=request, approve=True, comment="")
    assert guaranteed(org, org.alpha) == 12
    with pytest.raises(ConflictError, match="already pending"):
        ask(org, "tina", org.alpha, 15)


def test_a_quota_request_that_cannot_fit_is_refused_at_once(tight_research: Org) -> None:
    org = tight_research
    # tina sees only her team: the error names no figure of the parent or of team-bravo
    with pytest.raises(ValidationError, match="more than 'research' has left to guarantee"):
        ask(org, "tina", org.alpha, 21)  # 21 + 12 > 32
    assert not ApprovalRequest.objects.exists()


def test_two_quota_approvals_exceeding_the_parent_one_wins_in_turn(tight_research: Org) -> None:
    org = tight_research
    first, second = ask(org, "tina", org.alpha, 18), ask(org, "bea-bravo", org.bravo, 18)
    approval_decide(user=org.users["dana"], request=first, approve=True, comment="")
    with pytest.raises(ValidationError, match="above the parent's guarantee"):
        approval_decide(user=org.users["dana"], request=second, approve=True, comment="")
    second.refresh_from_db()
    assert second.state == ApprovalState.PENDING  # nothing landed; it can still be rejected
    assert (guaranteed(org, org.alpha), guaranteed(org, org.bravo)) == (18, 12)


def test_two_quota_approvals_at_once_exceeding_the_parent_exactly_one_succeeds(
    transactional_db: Any,
    seeded_classes: None,
    tight_research: Org,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 18 + 18 = 36 > research's 32; each alone fits (18 + 12 = 30).
    org = tight_research
    first, second = ask(org, "tina", org.alpha, 18), ask(org, "bea-bravo", org.bravo, 18)
    wait_after_checks(monkeypatch, 2)
    dana, pat = org.users["dana"], org.users["pat"]
    results = run_in_threads(
        lambda: approval_decide(user=dana, request=first, approve=True, comment=""),
        lambda: approval_decide(user=pat, request=second, approve=True, comment=""),
    )
    assert sorted(kind for kind, _ in results) == ["error", "ok"], results
    assert isinstance(next(v for k, v in results if k == "error"), ValidationError)
    assert sorted([guaranteed(org, org.alpha), guaranteed(org, org.bravo)]) == [12, 18]
    states = sorted(ApprovalRequest.objects.values_list("state", flat=True))
    assert states == [ApprovalState.APPROVED, ApprovalState.PENDING]


def test_the_requester_withdraws_a_quota_request(tight_research: Org) -> None:
    org = tight_research
    request = ask(org, "tina", org.alpha, 14)
    with pytest.raises(PermissionDenied):
        approvals.approval_withdraw(user=org.users["alice"], request=request)
    approvals.approval_withdraw(user=org.users["tina"], request=request)
    request.refresh_from_db()
    assert request.state == ApprovalState.CANCELLED
    with pytest.raises(ConflictError):
        approval_decide(user=org.users["dana"], request=request, approve=True, comment="")
    assert guaranteed(org, org.alpha) == 12
    assert ask(org, "tina", org.alpha, 15).state == ApprovalState.PENDING  # may ask again


# --- the beat task and a broker that is down (docs/faults.md 8, 9, 10) ----------------------------


def test_the_beat_task_expires_and_emails_once(org: Org, pending_job: Job) -> None:
    from tenants.tasks import approvals_expire

    ApprovalRequest.objects.filter(subject_id=pending_job.pk).update(
        expires_at=timezone.now() - timedelta(minutes=1)
    )
    assert approvals_expire() == 1
    assert approvals_expire() == 0  # the next beat, or a second beat process
    pending_job.refresh_from_db()
    assert (pending_job.state, pending_job.reason) == (JobState.REJECTED, "approval expired")
    assert len(mail.outbox) == 1  # sent by the sweep, once, although the queueing was lost
    assert "expired" in mail.outbox[0].subject


def test_a_broker_that_is_down_costs_no_decision(
    org: Org, pending_job: Job, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    from tenants import tasks

    def down(*args: Any) -> None:
        raise OSError("connection refused")

    monkeypatch.setattr(tasks.approval_notify, "delay", down)
    request = approval_decide(
        user=org.users["tina"], request=request_of(pending_job), approve=True, comment=""
    )
    real_enqueue_notification(request.pk)  # what on_commit runs: logs, does not raise
    assert "could not queue the notification" in caplog.text
    assert request_of(pending_job).state == ApprovalState.APPROVED


def test_the_api_finds_a_jobs_approval_request(org: Org, pending_job: Job, client_for: Any) -> None:
    def requests_of(job: Job) -> list[int]:
        rows = (
            client_for("alice")
            .get("/api/v1/approval-requests/", {"kind": "job", "subject_id": job.pk})
            .json()["results"]
        )
        return [row["id"] for row in rows]

    assert requests_of(pending_job) == [request_of(pending_job).pk]
    small = submit(org, replicas=1, resources={"gpus": 1, "cpu_milli": 1000, "memory_mib": 1024})
    assert small.state == JobState.QUEUED
    assert requests_of(small) == []


def test_every_kind_of_request_is_settled_by_its_registered_handler(
    tight_research: Org, pending_job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One decide path: approval_decide knows no kind; the quota change, like the job, is
    # applied by the handler registered for its kind.
    org = tight_research
    settled: list[tuple[str, str]] = []
    monkeypatch.setattr(approvals, "_SUBJECT_HANDLERS", dict(approvals._SUBJECT_HANDLERS))
    for kind in (ApprovalKind.JOB, ApprovalKind.QUOTA):
        register_subject_handler(
            kind, lambda *, request, outcome, actor: settled.append((request.kind, outcome))
        )
    approval_decide(
        user=org.users["tina"], request=request_of(pending_job), approve=True, comment=""
    )
    approval_decide(
        user=org.users["dana"], request=ask(org, "tina", org.alpha, 18), approve=True, comment=""
    )
    assert settled == [
        (ApprovalKind.JOB, ApprovalState.APPROVED),
        (ApprovalKind.QUOTA, ApprovalState.APPROVED),
    ]
    pending_job.refresh_from_db()
    assert pending_job.state == JobState.PENDING_APPROVAL  # the real handlers did not run
    assert guaranteed(org, org.alpha) == 12


@pytest.mark.parametrize(
    ("spec", "matches"),
    [
        ({"replicas": 2, "resources": {"gpus": 4}}, False),  # exactly 8 is not over
        ({"replicas": 3, "resources": {"gpus": 3}}, True),  # 9
        ({"replicas": 1, "resources": {"gpu_milli": 500, "gpu_memory_mib": 20000}}, False),
        ({"replicas": 1, "resources": {"gpu_milli": 750, "gpu_memory_mib": 20000}}, True),
    ],
    ids=["8", "9", "half", "three-quarters"],
)
def test_submit_applies_the_gpus_rule(org: Org, spec: dict[str, Any], matches: bool) -> None:
    policy(org, "gpus_over", threshold=8 if spec["replicas"] > 1 else 0.5)
    job = submit(org, **spec)
    assert (job.state == JobState.PENDING_APPROVAL) is matches, job.reason
    if matches:
        assert "team-alpha" in request_of(job).rules[0]["reason"]


@pytest.mark.parametrize(
    ("priority", "matches"), [("critical", True), ("high", True), ("normal", False)]
)
def test_submit_applies_the_priority_rule(org: Org, priority: str, matches: bool) -> None:
    policy(org, "priority_at_least", priority_class=PriorityClass.objects.get(name="high"))
    job = submit(org, priority_class=priority)
    assert (job.state == JobState.PENDING_APPROVAL) is matches, job.reason


@pytest.mark.parametrize(
    ("write", "allowed"),
    [
        # research guarantees 32; alpha and bravo 16 each
        (lambda org: Quota.objects.filter(tenant=org.alpha).update(guaranteed_milli=17000), False),
        (lambda org: Quota.objects.filter(tenant=org.alpha).update(guaranteed_milli=15000), True),
        (
            lambda org: Quota.objects.filter(tenant=org.research).update(guaranteed_milli=31000),
            False,
        ),  # below its children's 32
        (
            lambda org: f.QuotaFactory(
                tenant=f.TenantFactory(parent=org.charlie),
                flavor=org.h100,
                guaranteed_milli=16001,
                limit_milli=16001,
            ),
            False,
        ),
        (
            lambda org: f.QuotaFactory(
                tenant=f.TenantFactory(parent=org.charlie),
                flavor=org.a100,
                guaranteed_milli=1,
                limit_milli=1,
            ),
            False,
        ),  # parent: none
    ],
    ids=[
        "child-above",
        "child-within",
        "parent-below-children",
        "new-child-above",
        "child-without-parent-quota",
    ],
)
def test_the_database_is_the_backstop_for_guarantees(
    org: Org, write: Callable[[Org], Any], allowed: bool
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the trigger exists on PostgreSQL only")
    if allowed:
        write(org)
        return
    with pytest.raises(IntegrityError, match="quota: "), transaction.atomic():
        write(org)
    assert guaranteed(org, org.alpha) == 16 and guaranteed(org, org.research) == 32
