"""Settings come from the environment; production settings pass `check --deploy` cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

PRODUCTION_ENV = {
    "GANTRY_PRODUCTION": "1",
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": "x7Hq2-production-secret-from-a-vault-9fK3mZp0LwQe8RtYv5UbNcXa1Sd4Gh6Jk",
    "DJANGO_ALLOWED_HOSTS": "gantry.example.com",
    "DATABASE_URL": "postgres://gantry@db.example.com:5432/gantry",
    "REDIS_URL": "redis://redis.example.com:6379/0",
}


# manage.py runs in a subprocess without the pass's DATABASE_URL, REDIS_URL, DJANGO_* or
# GANTRY_*: the same run on either pass of `make test`, so the SQLite pass leaves it out.
SUBPROCESS = pytest.mark.backend_independent(
    "manage.py in a subprocess whose environment the test sets"
)


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "GANTRY_"))}
    clean.pop("DATABASE_URL", None)
    clean.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@SUBPROCESS
def test_check_deploy_reports_nothing_with_production_settings() -> None:
    result = manage("check", "--deploy", "--fail-level", "DEBUG", env=PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


@SUBPROCESS
def test_check_deploy_flags_development_settings() -> None:
    """The same check fails on the embedded defaults, so the test above can fail."""
    result = manage("check", "--deploy", "--fail-level", "WARNING", env={})
    assert result.returncode != 0
    assert "security.W018" in result.stderr + result.stdout  # DEBUG on


@SUBPROCESS
def test_production_refuses_to_start_without_secret_key() -> None:
    env = {k: v for k, v in PRODUCTION_ENV.items() if k != "DJANGO_SECRET_KEY"}
    result = manage("check", env=env)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set" in result.stderr


def test_postgresql_sessions_bound_statements_and_skip_jit(db: None) -> None:
    """The daemon's queries are short: PostgreSQL's JIT compiled more than they ran."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL settings")
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('jit'), current_setting('lock_timeout')")
        assert cursor.fetchone() == ("off", "5s")


def test_postgresql_binds_parameters_on_the_server(db: None) -> None:
    """Values travel apart from the SQL text (`$1`), not quoted into it by psycopg in
    Python: the daemon sends arrays of thousands of ids every cycle."""
    import psycopg
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL settings")
    with connection.cursor() as cursor:
        assert not isinstance(cursor.cursor, psycopg.ClientCursor)
        cursor.execute(
            "SELECT query FROM pg_stat_activity"
            " WHERE pid = pg_backend_pid() AND cardinality(%s::int[]) > 0",
            [[41, 42]],
        )
        (sent,) = cursor.fetchone()
    assert "$1" in sent and "42" not in sent, sent


def test_postgresql_prepares_a_statement_run_again_and_again(db: None) -> None:
    """The daemon runs the same statements every cycle: from the fifth run on a connection,
    PostgreSQL keeps the statement parsed (and its plan, once a generic one is as good)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL settings")
    sql = "SELECT %s::int + 1 AS prepared_probe"
    prepared = "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s"
    with connection.cursor() as cursor:
        counts = []
        for run in range(6):
            cursor.execute(sql, [run])
            cursor.execute(prepared, ["%prepared_probe%"])
            counts.append(cursor.fetchone()[0])
    assert counts[0] == 0 and counts[-1] == 1, counts


def test_a_prepared_statement_is_planned_for_its_values(db: None) -> None:
    """A generic plan of `state = $1` cannot use the partial indexes on the state, and one
    chosen while the table is small would be kept as it grows: the web's prepared statements
    are planned for their values every time (the daemon's sessions weigh a generic plan:
    tests/daemon/test_plans.py)."""
    from django.db import connection

    from scheduler.models import Job, JobState

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL settings")
    from scheduler.snapshot.queue import queue_heads

    for _ in range(15):  # prepared at the fifth; a generic plan is weighed from the sixth on
        list(Job.objects.filter(state=JobState.PREEMPTED).values_list("id", flat=True))
        queue_heads(500, 50)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s AND (statement LIKE %s OR statement LIKE %s)",
            ["%scheduler_job%", "%state% = $1%", "%CROSS JOIN LATERAL%"],
        )
        plans = cursor.fetchall()
    assert len(plans) == 2, plans
    assert all(generic == 0 and custom == 10 for generic, custom in plans), plans


def test_server_side_binding_can_be_turned_off_for_poolers() -> None:
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("PostgreSQL settings")
    code = "from django.db import connection; print(connection.settings_dict['OPTIONS'])"
    on = manage("shell", "-c", code, env={"DATABASE_URL": url})
    off = manage(
        "shell", "-c", code, env={"DATABASE_URL": url, "GANTRY_DB_SERVER_SIDE_BINDING": "0"}
    )
    assert "'server_side_binding': True" in on.stdout, on.stdout + on.stderr
    assert "'prepare_threshold': 5" in on.stdout, on.stdout
    assert "'server_side_binding': False" in off.stdout, off.stdout + off.stderr
    assert "'prepare_threshold': None" in off.stdout, off.stdout


@SUBPROCESS
def test_trusted_proxies_that_are_not_addresses_refuse_to_start() -> None:
    """GANTRY_TRUSTED_PROXIES lists proxies (issue 17); the old count ("1") is refused, not
    read as a network."""
    result = manage("check", env={"GANTRY_TRUSTED_PROXIES": "1"})
    assert result.returncode != 0
    assert "GANTRY_TRUSTED_PROXIES: '1' is not an IP address or network" in result.stderr
    assert manage("check", env={"GANTRY_TRUSTED_PROXIES": "10.0.0.0/8, ::1"}).returncode == 0
