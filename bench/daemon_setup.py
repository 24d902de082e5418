"""Shared set-up of the daemon benchmarks: a fresh PostgreSQL database, Django on it, and
bulk creation of tenants, users, projects and queued jobs (bypassing `job_submit`, whose
per-job validation would dominate what is measured; the rows are what it would write).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/gantry_bench"


def _django_set_up() -> bool:
    """Whether Django's database layer is in use in this process: imported and configured
    (Kueue's half runs before any settings; reading them then raises)."""
    import sys

    if "django.db" not in sys.modules:
        return False
    from django.conf import settings

    return settings.configured


def forget_inherited_connections() -> None:
    """First thing in a forked process: drop, without closing, the database connections it
    inherited. They are the parent's (one still open there, such as a test's, is not closed
    by the parent's `connections.close_all()`): used or closed from here, they would write
    into the parent's TLS stream, and the server drops the connection with a bad record MAC.
    The next query opens a connection of this process's own."""
    if not _django_set_up():
        return
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        conn.connection = None
        conn.in_atomic_block = False
        conn.needs_rollback = False


@contextlib.contextmanager
def apart(play: Callable[[Any], Any], wait_s: float = 60.0) -> Iterator[list[Any]]:
    """`play(stop)` in a forked process of its own while the block runs: the simulated nodes
    are apart from any scheduler (Kueue and kube-scheduler are processes of their own, Gantry's
    daemon runs in the benchmark's), so nothing they do takes the daemon's interpreter lock.
    `stop` (an Event) is set when the block ends, and what `play` returned is then appended to
    the list yielded (nothing if the child did not answer within `wait_s`). The child drops the
    database connections it inherited first; `play` makes its own API client (the parent's
    pooled connections stay the parent's)."""
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(target=_play_apart, args=(play, stop, sending), daemon=True)
    process.start()
    results: list[Any] = []
    try:
        yield results
    finally:
        stop.set()
        if receiving.poll(wait_s):
            results.append(receiving.recv())
        process.join(timeout=15)
        if process.is_alive():
            process.terminate()


def _play_apart(play: Callable[[Any], Any], stop: Any, out: Any) -> None:
    forget_inherited_connections()
    result = None
    try:
        result = play(stop)
    finally:
        out.send(result)


def fresh_database(url: str) -> None:
    """Drop and create the database of `url`, point Django at it and migrate."""
    import psycopg

    if _django_set_up():  # a second run in this process: its connections go first
        from django.db import connections

        connections.close_all()
    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.setdefault("GANTRY_LOG_LEVEL", "WARNING")
    # As the daemon runs in production: DEBUG logs every query's SQL and time.
    os.environ.setdefault("DJANGO_DEBUG", "0")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def organisation(teams: Sequence[tuple[str, str | None, dict[str, Any]]]) -> dict[str, Any]:
    """Tenants (slug, parent slug, {flavor: (guaranteed, limit, lend_limit) milli}), each
    with a user and a project. Returns slug -> (tenant, user, project)."""
    from django.contrib.auth import get_user_model

    from tenants.models import Project, Quota, ResourceFlavor, Tenant

    out: dict[str, Any] = {}
    flavors: dict[str, ResourceFlavor] = {}
    for slug, parent, quotas in teams:
        up = out[parent][0] if parent else None
        tenant = Tenant.objects.create(slug=slug, name=slug, parent=up)
        tenant.path = f"{up.path if up else '/'}{tenant.pk}/"
        tenant.depth = up.depth + 1 if up else 0
        tenant.save(update_fields=["path", "depth"])
        for flavor, (guaranteed, limit, lend) in quotas.items():
            if flavor not in flavors:
                flavors[flavor] = ResourceFlavor.objects.create(name=flavor, memory_mib=81920)
            Quota.objects.create(
                tenant=tenant,
                flavor=flavors[flavor],
                guaranteed_milli=guaranteed,
                limit_milli=limit,
                lend_limit_milli=lend,
            )
        user = get_user_model().objects.create(username=f"u-{slug}")
        project = Project.objects.create(tenant=tenant, slug=slug, name=slug, namespace=slug)
        out[slug] = (tenant, user, project)
    return out


def job_rows(specs: Sequence[dict[str, Any]], now: Any) -> list[Any]:
    """Unsaved queued Job rows from dicts with team (tenant, user, project), name, gpus,
    replicas, duration_s, priority (a PriorityClass), and optionally max_runtime_s."""
    from scheduler.models import Job

    rows = []
    for s in specs:
        tenant, user, project = s["team"]
        spec = {
            "name": s["name"],
            "type": "batch",
            "image": "bench/job:1",
            "command": ["run"],
            "replicas": s["replicas"],
            "priority_class": s["priority"].name,
            "resources": {"gpus": s["gpus"], "cpu_milli": 1000, "memory_mib": 1024},
            "simulation": {"duration_s": s["duration_s"]},
        }
        rows.append(
            Job(
                project=project,
                tenant=tenant,
                submitted_by=user,
                name=s["name"],
                job_type="batch",
                state="queued",
                priority_class=s["priority"],
                spec=spec,
                replicas=s["replicas"],
                gpus_per_replica=s["gpus"],
                gpu_milli_per_replica=s["gpus"] * 1000,
                cpu_milli=1000,
                memory_mib=1024,
                flavors=[],
                max_runtime_s=s.get("max_runtime_s"),
                queued_at=now,
            )
        )
    return rows


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def postgres_cpu_s() -> float:
    """CPU seconds used so far by this connection's PostgreSQL backend (from /proc)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # PostgreSQL on another host
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
