"""The allocation NOTIFY trigger (migrations 0003, 0018): it wakes the daemon when an
allocation ends, not on other updates of allocations, and it stays linear in the rows a
statement updates (bench.k8s_peers: one cycle bound 10,000 pods, and the UPDATE of their
allocations spent longer in the trigger than the daemon's statement timeout)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from scheduler.models import Allocation
from tests.daemon.conftest import Env

pytestmark = pytest.mark.postgresql("LISTEN/NOTIFY and a PL/pgSQL trigger")


@pytest.fixture
def listener(transactional_db: Any) -> Iterator[psycopg.Connection[Any]]:
    params = connection.get_connection_params()
    for key in ("cursor_factory", "context", "server_side_binding"):
        params.pop(key, None)
    with psycopg.connect(**params, autocommit=True) as conn:
        conn.execute("LISTEN gantry_scheduler")
        yield conn


def heard(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5) if n.payload == "allocation"]


def placed(tenv: Env, jobs: int) -> list[int]:
    """Allocation ids of `jobs` jobs the daemon placed (their allocations are live)."""
    submitted = [tenv.submit(resources={"gpus": 1}) for _ in range(jobs)]
    tenv.run(tenv.daemon(), seconds=1.0)
    ids = list(
        Allocation.objects.filter(job__in=submitted, ended_at__isnull=True).values_list(
            "id", flat=True
        )
    )
    assert len(ids) == jobs
    return ids


def test_binding_live_allocations_wakes_nobody(tenv: Env, listener: Any) -> None:
    ids = placed(tenv, 2)
    heard(listener)  # whatever placing them sent
    Allocation.objects.filter(id__in=ids).update(bound_at=timezone.now())
    assert heard(listener) == []


def test_an_allocation_that_ends_wakes_the_daemon(tenv: Env, listener: Any) -> None:
    first, second = placed(tenv, 2)
    Allocation.objects.filter(id=first).update(ended_at=timezone.now())
    heard(listener)
    # One statement over an allocation that ended before and one that ends now.
    Allocation.objects.filter(id__in=[first, second]).update(ended_at=timezone.now())
    assert heard(listener) == ["allocation"]


def test_an_allocation_that_ended_before_does_not_wake_it_again(tenv: Env, listener: Any) -> None:
    (only,) = placed(tenv, 1)
    Allocation.objects.filter(id=only).update(ended_at=timezone.now())
    heard(listener)
    Allocation.objects.filter(id=only).update(ended_at=timezone.now())
    assert heard(listener) == []


def test_the_allocation_trigger_does_not_join_its_transition_tables(transactional_db: Any) -> None:
    # Transition tables have no index: a join of the two ran as a nested loop, n² for an
    # UPDATE of n allocations (10,000 bound in one cycle took longer than the daemon's
    # statement timeout). The plan inside a trigger cannot be asked for, so its text is.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('gantry_notify_allocation'::regproc)")
        (definition,) = cursor.fetchone()
    assert " JOIN " not in definition.upper()
    assert "EXCEPT" in definition.upper()
