"""Shared fixtures: an organisation with personas, and API clients logged in as each.

The organisation:

    acme (organisation)
    ├── research (department)      dana: admin
    │   ├── team-alpha (team)      alice: member, tina: admin     project proj-alpha
    │   └── team-bravo (team)      bob: member                    project proj-bravo
    └── product (department)
        └── team-charlie (team)    chris: member                  project proj-charlie

carol is finance, pat is platform admin. Every name of team-bravo's side contains "bravo" so
that an isolation test can search any response for the marker.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.conf import settings
from django.test.utils import override_settings
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from rest_framework.test import APIClient

from tenants.models import Project, ResourceFlavor, Tenant, TenantKind
from tests import factories as f
from tests.k8s.real_plane import deselect, real_plane

# Timing stays out of the suite (bench/ measures speed): Hypothesis's per-example deadline and
# its "input generation is slow" health check judge the host's load, not the code (on a host at
# load 17, tests/tenants/test_registry_names.py failed: two inputs drawn in 1.35 s). A test's own
# `settings` inherit this profile; its own suppress_health_check list replaces this one.
hypothesis_settings.register_profile(
    "gantry", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("gantry")

__all__ = ["real_plane"]  # one session fixture for every folder (two definitions: two planes)


@pytest.fixture(scope="session", autouse=True)
def _cache_per_worker(worker_id: str) -> Iterator[None]:
    """Each xdist worker gets its own Redis database for the cache: a test's `cache.clear()`
    (FLUSHDB) must not wipe the login-guard counters of a test running on the other worker.
    The API's rate-limit counts live in the worker's memory (the throttles do not care where):
    on Redis or in GANTRY_VAR_DIR's files, two workers' users of the same id would share a
    window."""
    caches = {
        **settings.CACHES,
        "throttle": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    }
    cache = settings.CACHES["default"]
    location = str(cache.get("LOCATION", ""))
    if worker_id != "master" and location.startswith("redis://"):
        # After REDIS_URL's own database: two suites run at once on different databases
        # (REDIS_URL=.../0 and .../8) do not flush each other's.
        base, _, own = location.rpartition("/")
        database = (int(own) if own.isdigit() else 0) + int(worker_id.removeprefix("gw")) + 1
        caches["default"] = {**cache, "LOCATION": f"{base}/{database}"}
    with override_settings(CACHES=caches):
        yield


@pytest.fixture(scope="session", autouse=True)
def _flush_past_the_books() -> Iterator[None]:
    """A transactional test ends with Django's flush, which deletes every row; on SQLite that
    is a DELETE the books' triggers refuse once a rate version priced metered hours or a
    statement was sealed (PostgreSQL truncates, which fires no row trigger). The flush runs
    with those triggers lifted and put back (billing/statements/guards.py), as only a test's
    teardown may."""
    from django.core.management.commands import flush
    from django.db import connections

    from billing.statements.guards import lifted

    handle = flush.Command.handle

    def lifted_handle(self: Any, **options: Any) -> Any:
        connection = connections[options.get("database") or "default"]
        if connection.vendor != "sqlite":
            return handle(self, **options)
        with lifted(connection):
            return handle(self, **options)

    flush.Command.handle = lifted_handle  # type: ignore[method-assign]
    yield
    flush.Command.handle = handle  # type: ignore[method-assign]


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """`@pytest.mark.postgresql("why")`: the test pins a behaviour that exists only on
    PostgreSQL (the daemon's row-version cache, NOTIFY, the planner, server-side settings).
    On the embedded default (SQLite) it is skipped, saying why; everything else runs on both."""
    deselect(items, config)  # GANTRY_K8S_REAL=skip|db-only: real-cluster tests left to a pass
    if settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        return
    for item in items:
        marker = item.get_closest_marker("postgresql")
        if marker is not None:
            why = marker.args[0] if marker.args else "PostgreSQL only"
            item.add_marker(pytest.mark.skip(reason=f"PostgreSQL only: {why}"))


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Every test starts with an empty cache: throttles and login-guard counters of one test
    must not leak into the next (the embedded default's cache lives in the process), nor
    cost lines built from it (billing/statements/line_memo.py)."""
    fresh_cache()


def fresh_cache() -> None:
    """Empty the caches and memos that `_fresh_cache` empties before each test."""
    from django.core.cache import cache, caches

    from billing.statements import line_memo

    cache.clear()
    caches["throttle"].clear()
    line_memo.forget_built()


@dataclass
class Org:
    acme: Tenant
    research: Tenant
    product: Tenant
    alpha: Tenant
    bravo: Tenant
    charlie: Tenant
    proj_alpha: Project
    proj_bravo: Project
    proj_charlie: Project
    h100: ResourceFlavor
    a100: ResourceFlavor
    users: dict[str, Any]


def build_org() -> Org:
    f.seed_priority_classes()
    h100 = f.FlavorFactory(
        name="H100-80GB",
        memory_mib=81920,
        mig_profiles=["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"],
    )
    a100 = f.FlavorFactory(
        name="A100-40GB", memory_mib=40960, mig_profiles=["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]
    )
    acme = f.TenantFactory(slug="acme", kind=TenantKind.ORGANISATION)
    research = f.TenantFactory(slug="research", kind=TenantKind.DEPARTMENT, parent=acme)
    product = f.TenantFactory(slug="product", kind=TenantKind.DEPARTMENT, parent=acme)
    alpha = f.TenantFactory(slug="team-alpha", parent=research)
    bravo = f.TenantFactory(slug="team-bravo", parent=research)
    charlie = f.TenantFactory(slug="team-charlie", parent=product)
    for tenant, guaranteed, limit in [
        (acme, 64, 64),
        (research, 32, 64),
        (product, 32, 64),
        (alpha, 16, 32),
        (bravo, 16, 32),
        (charlie, 16, 32),
    ]:
        f.QuotaFactory(
            tenant=tenant, flavor=h100, guaranteed_milli=guaranteed * 1000, limit_milli=limit * 1000
        )
    users = {
        name: f.UserFactory(username=name)
        for name in ["alice", "tina", "bob-bravo", "dana", "chris", "carol", "pat"]
    }
    f.MembershipFactory(user=users["alice"], tenant=alpha, role="member")
    f.MembershipFactory(user=users["tina"], tenant=alpha, role="admin")
    f.MembershipFactory(user=users["bob-bravo"], tenant=bravo, role="member")
    f.MembershipFactory(user=users["dana"], tenant=research, role="admin")
    f.MembershipFactory(user=users["chris"], tenant=charlie, role="member")
    f.PlatformRoleFactory(user=users["carol"], role="finance")
    f.PlatformRoleFactory(user=users["pat"], role="platform_admin")
    return Org(
        acme=acme,
        research=research,
        product=product,
        alpha=alpha,
        bravo=bravo,
        charlie=charlie,
        proj_alpha=f.ProjectFactory(tenant=alpha, slug="proj-alpha"),
        proj_bravo=f.ProjectFactory(tenant=bravo, slug="proj-bravo"),
        proj_charlie=f.ProjectFactory(tenant=charlie, slug="proj-charlie"),
        h100=h100,
        a100=a100,
        users=users,
    )


@pytest.fixture
def org(db: Any) -> Org:
    return build_org()


@pytest.fixture
def client_for(org: Org):
    """client_for("alice") -> an APIClient authenticated as that persona (session, no CSRF)."""

    def make(username: str) -> APIClient:
        client = APIClient()
        client.force_authenticate(org.users[username])
        return client

    return make


def job_spec(**overrides: Any) -> dict[str, Any]:
    """A valid training spec; override any field."""
    spec: dict[str, Any] = {
        "name": "bert-pretrain",
        "type": "training",
        "image": "registry.example.com/nlp/bert:1.2",
        "command": ["python", "train.py", "--epochs", "3"],
        "replicas": 2,
        "resources": {"gpus": 4, "cpu_milli": 8000, "memory_mib": 65536},
        "flavors": ["H100-80GB"],
    }
    spec.update(overrides)
    return spec


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    """PBKDF2 costs ~0.3 s a user; tests do not need it."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
