"""factory_boy factories for the domain. Tenants get their materialised path on creation."""

from __future__ import annotations

import importlib
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.db.models import Model
from django.utils import timezone

from scheduler.models import Allocation, Job, JobEvent, JobState, Node
from tenants.models import (
    Membership,
    PlatformRole,
    PriorityClass,
    PriorityDefault,
    Project,
    Quota,
    ResourceFlavor,
    Tenant,
    TenantKind,
)


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.django.Password("correct-horse-battery")


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant
        skip_postgeneration_save = True

    slug = factory.Sequence(lambda n: f"tenant-{n}")
    name = factory.LazyAttribute(lambda t: t.slug.title())
    kind = TenantKind.TEAM
    parent = None

    @factory.post_generation
    def set_path(obj: Tenant, create: bool, extracted: Any, **kwargs: Any) -> None:
        parent = obj.parent
        obj.path = f"{parent.path if parent else '/'}{obj.pk}/"
        obj.depth = parent.depth + 1 if parent else 0
        obj.save(update_fields=["path", "depth"])


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    tenant = factory.SubFactory(TenantFactory)
    slug = factory.Sequence(lambda n: f"project-{n}")
    name = factory.LazyAttribute(lambda p: p.slug.title())
    namespace = factory.LazyAttribute(lambda p: p.slug)


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    tenant = factory.SubFactory(TenantFactory)
    role = "member"


class PlatformRoleFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = PlatformRole

    user = factory.SubFactory(UserFactory)
    role = "platform_admin"


class FlavorFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ResourceFlavor
        django_get_or_create = ("name",)

    name = factory.Sequence(lambda n: f"GPU-{n}")
    memory_mib = 81920


class QuotaFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Quota

    tenant = factory.SubFactory(TenantFactory)
    flavor = factory.SubFactory(FlavorFactory)
    guaranteed_milli = 8000
    limit_milli = 16000


def seed_priority_classes() -> None:
    """The migration's seed, again: a transactional test's flush removes migrated data.

    The suite never uses serialized rollback (it breaks after any flush); fixtures that need
    seeded rows call this instead. It is idempotent.
    """
    from django.apps import apps

    migration = importlib.import_module("tenants.migrations.0002_seed_priority_classes")
    # Seeded already (in every test but one after a flush): two counts instead of the seed's
    # lookups one row at a time, on every organisation's build (tests/conftest.py's build_org).
    names = [name for name, *_ in migration.CLASSES]
    if PriorityClass.objects.filter(name__in=names).count() == len(names) and (
        PriorityDefault.objects.filter(tenant=None, job_type__in=list(migration.DEFAULTS)).count()
        == len(migration.DEFAULTS)
    ):
        return
    migration.seed(apps, None)


def priority(name: str = "normal") -> PriorityClass:
    found = PriorityClass.objects.filter(name=name).first()
    if found is None:
        seed_priority_classes()
        found = PriorityClass.objects.get(name=name)
    return found


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job

    project = factory.SubFactory(ProjectFactory)
    tenant = factory.LazyAttribute(lambda j: j.project.tenant)
    submitted_by = factory.SubFactory(UserFactory)
    name = factory.Sequence(lambda n: f"job-{n}")
    job_type = "training"
    state = JobState.QUEUED
    priority_class = factory.LazyFunction(priority)
    spec = factory.LazyAttribute(
        lambda j: {
            "name": j.name,
            "type": j.job_type,
            "image": "pytorch/pytorch:2.4",
            "command": ["python", "train.py"],
        }
    )
    replicas = 1
    gpus_per_replica = 1
    gpu_milli_per_replica = 1000


class JobEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = JobEvent

    job = factory.SubFactory(JobFactory)
    kind = "submitted"
    to_state = JobState.QUEUED


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"gpu-node-{n}")
    flavor = "H100-80GB"
    cpu_milli = 64_000
    memory_mib = 512 * 1024


class AllocationFactory(factory.django.DjangoModelFactory):
    """One replica of a job placed on a node (active unless `ended_at` is given)."""

    class Meta:
        model = Allocation

    job = factory.SubFactory(JobFactory)
    node = factory.SubFactory(NodeFactory)
    attempt = factory.LazyAttribute(lambda a: a.job.attempt)
    replica = 0
    pod_name = factory.LazyAttribute(lambda a: f"gantry-{a.job.pk}-a{a.attempt}-r{a.replica}")
    namespace = factory.LazyAttribute(lambda a: a.job.project.namespace)
    flavor = factory.LazyAttribute(lambda a: a.node.flavor)
    gpu_milli = factory.LazyAttribute(lambda a: a.job.gpu_milli_per_replica)
    started_at = factory.LazyFunction(timezone.now)


def place(job: Job, node: Node | None = None) -> list[Allocation]:
    """Active allocations for every replica of `job` (on `node`, else a new H100 node)."""
    node = node or NodeFactory()
    return [AllocationFactory(job=job, node=node, replica=r) for r in range(job.replicas)]


def row_columns(row: Model) -> dict[str, Any]:
    """The row's column values but its key: to bulk-create copies of it."""
    meta = type(row)._meta
    return {f.attname: getattr(row, f.attname) for f in meta.concrete_fields if not f.primary_key}
