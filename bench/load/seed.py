"""The load benchmark's organisation: the demo's tenants, quotas, policies and nodes, then
`users` people with memberships and API tokens, more projects, approval policies that send
the larger submissions to approvers, a history of finished jobs with their events and
allocations, a rate card, and that history metered, so that lists, filters and cost pages
answer over real data.

Runs in the benchmark's own process on the database the product uses (Django set up on it).
The history rows are written in bulk, as the scheduler would have left them; everything a
person does (submit, approve) is left to the load itself.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

LOAD_PASSWORD = "gantry-load-bench"
TEAMS = ("nlp", "vision", "search", "assist")
# Submissions over this many GPUs need an approver of the team (the demo's NLP rule asks 16).
APPROVAL_OVER_GPUS = 4
APPROVERS_PER_TEAM, ADMINS_PER_TEAM = 3, 1
WORDS = ("llama", "bert", "vit", "whisper", "ranker", "sweep", "eval", "distill", "rlhf", "ocr")
TYPES = ("training", "fine-tuning", "evaluation", "batch", "inference")


@dataclass
class Person:
    username: str
    token: str
    role: str  # member, approver, admin, finance
    team: str  # "" for finance
    projects: list[int] = field(default_factory=list)
    session: str = ""  # a signed-in portal session's key


def sessions(users: list[Any]) -> list[str]:
    """A signed-in portal session per user, as the login view leaves it. Each real login
    hashes the password, a CPU-second or more on a busy host: the virtual users sign in through
    the form a few at a time, and the others start from these."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    keys = []
    for user in users:
        store = SessionStore()
        store[SESSION_KEY] = str(user.pk)
        store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
        store[HASH_SESSION_KEY] = user.get_session_auth_hash()
        store.create()
        keys.append(store.session_key or "")
    return keys


@dataclass
class Seeded:
    people: list[Person]
    teams: dict[str, int]  # slug -> tenant id
    history_jobs: int
    usage_records: int


def seed(users: int, history_hours: float, seed: int, now: datetime) -> Seeded:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from rest_framework.authtoken.models import Token

    from scheduler.backends.simulated.inventory import demo_nodes
    from scheduler.demo.seed import seed_demo
    from scheduler.nodes.services import node_sync
    from tenants.approval_policies import policy_set
    from tenants.models import Membership, PlatformRole, Project, Tenant

    rng = random.Random(seed)
    seed_demo()
    node_sync(demo_nodes())
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=TEAMS)}
    admin = get_user_model().objects.get(username="admin")
    for slug in TEAMS:
        if slug != "nlp":  # the demo's NLP rule stays: larger jobs there ask for approval too
            policy_set(
                user=admin, tenant=tenants[slug], rule="gpus_over", threshold=APPROVAL_OVER_GPUS
            )
        for suffix in ("exp", "prod"):
            Project.objects.get_or_create(
                tenant=tenants[slug],
                slug=f"{slug}-{suffix}",
                defaults={"name": f"{slug} {suffix}", "namespace": f"{slug}-{suffix}"},
            )
    projects: dict[str, list[int]] = {slug: [] for slug in TEAMS}
    for pk, team in Project.objects.filter(tenant__slug__in=TEAMS).values_list(
        "pk", "tenant__slug"
    ):
        projects[team].append(pk)
    # One hash for every user: hashing each password would take minutes of CPU here.
    password = make_password(LOAD_PASSWORD)
    rows, roles = [], []
    for n in range(users):
        team = TEAMS[n % len(TEAMS)]
        rank = n // len(TEAMS)
        role = (
            "finance"
            if n == users - 1
            else "approver"
            if rank < APPROVERS_PER_TEAM
            else "admin"
            if rank < APPROVERS_PER_TEAM + ADMINS_PER_TEAM
            else "member"
        )
        rows.append(get_user_model()(username=f"load{n:03d}", password=password))
        roles.append((role, "" if role == "finance" else team))
    made = get_user_model().objects.bulk_create(rows)
    tokens = Token.objects.bulk_create([Token(user=u, key=Token.generate_key()) for u in made])
    Membership.objects.bulk_create(
        [
            Membership(user=u, tenant=tenants[team], role=role)
            for u, (role, team) in zip(made, roles, strict=True)
            if team
        ]
    )
    PlatformRole.objects.bulk_create(
        [
            PlatformRole(user=u, role="finance")
            for u, (role, _) in zip(made, roles, strict=True)
            if role == "finance"
        ]
    )
    people = [
        Person(u.username, t.key, role, team, projects.get(team, []), session)
        for u, t, (role, team), session in zip(made, tokens, roles, sessions(made), strict=True)
    ]
    jobs = history(made, roles, projects, tenants, history_hours, rng, now)
    usage = billing(now)
    return Seeded(people, {s: t.pk for s, t in tenants.items()}, jobs, usage)


def history(
    users: list[Any],
    roles: list[tuple[str, str]],
    projects: dict[str, list[int]],
    tenants: dict[str, Any],
    hours: float,
    rng: random.Random,
    now: datetime,
) -> int:
    """Finished one-GPU jobs one after another on each device over the last `hours` (ending an
    hour before `now`), with their events and allocations. Returns how many."""
    from scheduler.models import Allocation, AllocationDevice, GpuDevice, Job, JobEvent
    from tenants.models import PriorityClass

    priority = PriorityClass.objects.get(name="normal")
    by_team: dict[str, list[Any]] = {t: [] for t in TEAMS}
    for user, (_, team) in zip(users, roles, strict=True):
        if team:
            by_team[team].append(user)
    devices = list(GpuDevice.objects.select_related("node").order_by("node__name", "index"))
    end = now - timedelta(hours=1)
    planned = []
    for device in devices:
        at = end - timedelta(hours=hours) + timedelta(minutes=rng.uniform(0, 30))
        while True:
            length = timedelta(minutes=rng.uniform(10, 120))
            if at + length > end:
                break
            planned.append((device, at, at + length))
            at += length + timedelta(minutes=rng.uniform(0, 30))
    rows = []
    for n, (device, start, stop) in enumerate(planned):
        team = rng.choice(TEAMS)
        state = rng.choices(("succeeded", "failed", "cancelled"), (85, 10, 5))[0]
        job_type = rng.choice(TYPES)
        name = f"{rng.choice(WORDS)}-{job_type}-{n}"
        rows.append(
            Job(
                project_id=rng.choice(projects[team]),
                tenant=tenants[team],
                submitted_by=rng.choice(by_team[team] or users),
                name=name,
                job_type=job_type,
                state=state,
                priority_class=priority,
                spec={
                    "name": name,
                    "type": job_type,
                    "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                    "command": ["python", "-m", "train"],
                    "replicas": 1,
                    "resources": {"gpus": 1, "cpu_milli": 4000, "memory_mib": 32768},
                    "flavors": [device.node.flavor],
                },
                replicas=1,
                gpus_per_replica=1,
                gpu_milli_per_replica=1000,
                cpu_milli=4000,
                memory_mib=32768,
                flavors=[device.node.flavor],
                queued_at=start - timedelta(seconds=rng.uniform(5, 600)),
                started_at=start,
                finished_at=stop,
                reason="" if state == "succeeded" else f"{state} (history)",
            )
        )
    made = Job.objects.bulk_create(rows, batch_size=2000)
    for job, (_, start, _) in zip(made, planned, strict=True):
        job.created_at = job.queued_at or start
    Job.objects.bulk_update(made, ["created_at"], batch_size=2000)
    allocations = Allocation.objects.bulk_create(
        [
            Allocation(
                job=job,
                node=device.node,
                attempt=0,
                replica=0,
                pod_name=f"gantry-{job.pk}-a0-r0",
                namespace=f"history-{job.project_id}",
                flavor=device.node.flavor,
                gpu_milli=1000,
                started_at=start,
                bound_at=start,
                ended_at=stop,
                end_reason=job.state,
            )
            for job, (device, start, stop) in zip(made, planned, strict=True)
        ],
        batch_size=2000,
    )
    AllocationDevice.objects.bulk_create(
        [
            AllocationDevice(allocation=a, device=device, milli=1000, released=True)
            for a, (device, _, _) in zip(allocations, planned, strict=True)
        ],
        batch_size=2000,
    )
    events = []
    for job, (_, start, stop) in zip(made, planned, strict=True):
        for at, kind, before, after in (
            (job.queued_at or start, "submitted", "", "queued"),
            (start, "state", "queued", "admitted"),
            (start, "state", "binding", "running"),
            (stop, "state", "running", job.state),
        ):
            events.append(JobEvent(job=job, kind=kind, from_state=before, to_state=after, at=at))
    made_events = JobEvent.objects.bulk_create(events, batch_size=5000)
    for event, source in zip(made_events, events, strict=True):
        event.at = source.at
    JobEvent.objects.bulk_update(made_events, ["at"], batch_size=5000)
    return len(made)


def billing(now: datetime) -> int:
    """A rate card per flavor from well before the history, then the history metered by the
    product's own metering task (its open month rated for the cost routes' readers, as the
    task does). Returns the usage records written."""
    from django.conf import settings

    from billing.costs.lines import open_month_rated
    from billing.metering.hourly import meter_usage
    from billing.models import RateCard, UsageRecord
    from tenants.models import ResourceFlavor

    prices = {"H100-80GB": "3.20", "A100-40GB": "1.80", "L40S-48GB": "1.10", "T4-16GB": "0.40"}
    for flavor in ResourceFlavor.objects.all():
        RateCard.objects.get_or_create(
            flavor=flavor,
            valid_from=datetime(2020, 1, 1, tzinfo=now.tzinfo),
            defaults={
                "currency": settings.GANTRY_BILLING_CURRENCY,
                "gpu_hour": Decimal(prices.get(flavor.name, "1.00")),
            },
        )
    while meter_usage(now=now):  # a run meters a bounded number of hours
        pass
    open_month_rated()  # as the hourly metering task does once it has metered
    return UsageRecord.objects.count()
