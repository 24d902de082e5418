"""The demo organisation: realistic tenants, users for every role, quotas, projects, jobs.

`seed_demo` builds it once; running it again changes nothing and prints the logins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from scheduler.jobs.services import job_cancel, job_submit
from tenants.approval_policies import policy_set
from tenants.models import (
    Membership,
    PlatformRole,
    PriorityClass,
    Project,
    Quota,
    ResourceFlavor,
    Tenant,
    TenantKind,
)

DEMO_PASSWORD = "gantry-demo"  # printed to the person who runs the demo

FLAVORS = [
    # name, memory MiB, MIG profiles
    ("H100-80GB", 81920, ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("A100-40GB", 40960, ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("L40S-48GB", 49152, []),
    ("T4-16GB", 16384, []),
]
# slug, name, kind, parent slug
TENANTS = [
    ("acme", "Acme AI", TenantKind.ORGANISATION, None),
    ("research", "Research", TenantKind.DEPARTMENT, "acme"),
    ("product", "Product", TenantKind.DEPARTMENT, "acme"),
    ("nlp", "NLP", TenantKind.TEAM, "research"),
    ("vision", "Vision", TenantKind.TEAM, "research"),
    ("search", "Search", TenantKind.TEAM, "product"),
    ("assist", "Assistant", TenantKind.TEAM, "product"),
]
# tenant slug -> {flavor: (guaranteed GPUs, limit GPUs)}
QUOTAS = {
    "acme": {
        "H100-80GB": (32, 32),
        "A100-40GB": (32, 32),
        "L40S-48GB": (16, 16),
        "T4-16GB": (16, 16),
    },
    "research": {"H100-80GB": (20, 32), "A100-40GB": (16, 32), "T4-16GB": (4, 16)},
    "product": {
        "H100-80GB": (12, 32),
        "A100-40GB": (16, 32),
        "L40S-48GB": (16, 16),
        "T4-16GB": (12, 16),
    },
    "nlp": {"H100-80GB": (12, 24), "A100-40GB": (8, 16)},
    "vision": {"H100-80GB": (8, 16), "A100-40GB": (8, 16), "T4-16GB": (4, 8)},
    "search": {"A100-40GB": (8, 16), "L40S-48GB": (8, 16), "T4-16GB": (6, 12)},
    "assist": {
        "H100-80GB": (12, 24),
        "A100-40GB": (8, 16),
        "L40S-48GB": (8, 16),
        "T4-16GB": (6, 12),
    },
}
# username, tenant slug or platform role, role
USERS = [
    ("ana", "nlp", "member"),
    ("nils", "nlp", "approver"),
    ("nora", "nlp", "admin"),
    ("vik", "vision", "member"),
    ("vera", "vision", "admin"),
    ("sam", "search", "member"),
    ("ada", "assist", "member"),
    ("rita", "research", "admin"),
    ("paul", "product", "admin"),
    ("fiona", None, "finance"),
    ("admin", None, "platform_admin"),
]
PROJECTS = [
    ("nlp", "llm-pretrain"),
    ("nlp", "nlp-eval"),
    ("vision", "detector"),
    ("search", "ranker"),
    ("assist", "chat-serving"),
]
JOBS = [
    # submitter, project, name, type, replicas, gpus, flavor
    ("ana", "llm-pretrain", "llama-8b-pretrain", "training", 2, 8, "H100-80GB"),
    ("ana", "nlp-eval", "mmlu-eval", "evaluation", 1, 1, "A100-40GB"),
    ("vik", "detector", "yolo-finetune", "fine-tuning", 1, 4, "A100-40GB"),
    ("sam", "ranker", "ranker-batch-scoring", "batch", 4, 1, "T4-16GB"),
    ("ada", "chat-serving", "chat-7b-serving", "inference", 2, 1, "L40S-48GB"),
    # 3 x 8 = 24 GPUs: over NLP's 16-GPU approval threshold, so it waits for nils or nora.
    ("ana", "llm-pretrain", "llama-70b-pretrain", "training", 3, 8, "H100-80GB"),
    ("vik", "detector", "detector-sweep", "batch", 2, 1, "T4-16GB"),
]
CANCELLED_JOBS = {"detector-sweep"}
# tenant, rule, threshold, priority class: what sends a job to approvers.
POLICIES = [
    ("nlp", "gpus_over", 16, None),
    ("research", "priority_at_least", None, "critical"),
    ("product", "runtime_over_hours", 48, None),
]


@dataclass
class DemoResult:
    created: bool
    logins: list[tuple[str, str]]


def _logins() -> list[tuple[str, str]]:
    out = []
    for username, tenant, role in USERS:
        out.append((username, f"{role} of {tenant}" if tenant else role))
    return out


@transaction.atomic
def seed_demo() -> DemoResult:
    if Tenant.objects.filter(slug="acme").exists():
        return DemoResult(created=False, logins=_logins())
    flavors = {
        name: ResourceFlavor.objects.create(name=name, memory_mib=mem, mig_profiles=mig)
        for name, mem, mig in FLAVORS
    }
    tenants: dict[str, Tenant] = {}
    for slug, name, kind, parent in TENANTS:
        tenant = Tenant.objects.create(
            slug=slug, name=name, kind=kind, parent=tenants.get(parent or "")
        )
        tenant.path = f"{tenants[parent].path if parent else '/'}{tenant.pk}/"
        tenant.depth = tenants[parent].depth + 1 if parent else 0
        tenant.save(update_fields=["path", "depth"])
        tenants[slug] = tenant
    for slug, per_flavor in QUOTAS.items():
        for flavor, (guaranteed, limit) in per_flavor.items():
            Quota.objects.create(
                tenant=tenants[slug],
                flavor=flavors[flavor],
                guaranteed_milli=guaranteed * 1000,
                limit_milli=limit * 1000,
            )
    users = _create_users(tenants)
    projects = {
        slug: Project.objects.create(
            tenant=tenants[team],
            slug=slug,
            name=slug.replace("-", " ").title(),
            namespace=f"{team}-{slug}",
        )
        for team, slug in PROJECTS
    }
    _create_policies(tenants, users["admin"])
    for username, project, name, job_type, replicas, gpus, flavor in JOBS:
        spec = {
            "name": name,
            "type": job_type,
            "image": "nvcr.io/nvidia/pytorch:24.05-py3",
            "command": ["python", "-m", "train"],
            "replicas": replicas,
            "resources": {"gpus": gpus, "cpu_milli": 4000 * gpus, "memory_mib": 32768 * gpus},
            "flavors": [flavor],
            "simulation": {"duration_s": 600},
        }
        job, _ = job_submit(user=users[username], project=projects[project], payload=spec)
        if name in CANCELLED_JOBS:
            job_cancel(user=users[username], job=job, reason="submitted with the wrong dataset")
    return DemoResult(created=True, logins=_logins())


def _create_policies(tenants: dict[str, Tenant], admin: Any) -> None:
    for slug, rule, threshold, priority in POLICIES:
        policy_set(
            user=admin,
            tenant=tenants[slug],
            rule=rule,
            threshold=threshold,
            priority_class=PriorityClass.objects.get(name=priority) if priority else None,
        )


def _create_users(tenants: dict[str, Tenant]) -> dict[str, Any]:
    user_model = get_user_model()
    users = {}
    for username, tenant, role in USERS:
        user = user_model.objects.create_user(
            username=username, email=f"{username}@acme.example", password=DEMO_PASSWORD
        )
        if tenant:
            Membership.objects.create(user=user, tenant=tenants[tenant], role=role)
        else:
            PlatformRole.objects.create(user=user, role=role)
        users[username] = user
    return users
