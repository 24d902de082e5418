"""Issue 17, point 2: every state that holds devices (admitted, binding, running) can be
preempted and drained, and a change the lifecycle forbids, or one that could not be
written, is never dropped in silence."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from scheduler.jobs.transitions import Change, DisallowedChange, transition
from scheduler.models import Allocation, Job, JobEvent, Node
from scheduler.nodes.services import node_drain
from tests.daemon.conftest import Env, Killed, assert_consistent, expire_leases
from tests.daemon.test_faults import pg


def _raise() -> None:
    raise Killed


def _node_of(job: Job) -> Node:
    return Allocation.objects.get(job=job, ended_at__isnull=True).node


def _drain(env: Env, node: Node) -> None:
    node_drain(user=env.org.users["pat"], node=node, reason="firmware update")


def test_a_change_the_lifecycle_forbids_is_refused_where_it_is_made() -> None:
    with pytest.raises(DisallowedChange, match="queued -> running"):
        Change(1, ("queued",), "running")
    with pytest.raises(DisallowedChange, match="through running"):
        Change(1, ("admitted",), "succeeded", via="running")
    # every holding state may be preempted
    Change(1, ("admitted", "binding", "running"), "preempted")


def test_transition_reports_every_change_it_did_not_apply(env: Env) -> None:
    moved, done = env.submit(), env.submit()
    Job.objects.filter(pk=moved.pk).update(state="cancelled")
    now = timezone.now()
    changes = [Change(j.pk, ("queued",), "admitted") for j in (moved, done)]
    changes.append(Change(10**9, ("queued",), "admitted"))  # no such job
    with transaction.atomic():
        result = transition(changes, now)
    assert result.done == {done.pk: "queued"}
    assert result.moved == {moved.pk: "cancelled"}
    assert result.busy == {10**9}
    assert result.missed == {moved.pk, 10**9}


def test_drain_preempts_a_binding_job(env: Env) -> None:
    env.backend.start_delay_s = 10**9  # the pod never starts: the job stays binding
    job = env.submit(simulation={"duration_s": 600})
    daemon = env.daemon()
    env.run(daemon)
    job.refresh_from_db()
    assert job.state == "binding"
    node = _node_of(job)
    _drain(env, node)
    env.run(daemon, seconds=1)
    job.refresh_from_db()
    assert job.state == "preempted"
    assert JobEvent.objects.filter(job=job, kind="preempted", from_state="binding").exists()
    node.refresh_from_db()
    assert node.drain_requested is False
    env.run(daemon, seconds=3, cycles=2)
    job.refresh_from_db()
    assert (job.state, job.attempt) == ("binding", 1)
    assert _node_of(job) != node
    assert_consistent(env.backend)


def test_drain_preempts_an_admitted_job(env: Env) -> None:
    job = env.submit(simulation={"duration_s": 600})
    crashed = env.daemon("crashed", hooks={"pods_created": _raise})
    with pytest.raises(Killed):
        crashed.step()  # claimed and its pod created; never bound: the job stays admitted
    job.refresh_from_db()
    assert job.state == "admitted"
    node = _node_of(job)
    _drain(env, node)
    expire_leases()
    daemon = env.daemon("next")
    env.run(daemon)  # the drain runs before reconcile would adopt the claim
    assert JobEvent.objects.filter(job=job, kind="preempted", from_state="admitted").exists()
    node.refresh_from_db()
    assert node.drain_requested is False
    env.run(daemon, seconds=3, cycles=2)
    job.refresh_from_db()
    assert job.state in ("binding", "running") and job.attempt == 1
    assert _node_of(job) != node
    assert_consistent(env.backend)


@pytest.mark.postgresql("a row lock held by a second connection")
def test_drain_keeps_its_request_while_a_job_cannot_be_moved(tenv: Env) -> None:
    job = tenv.submit(simulation={"duration_s": 600})
    daemon = tenv.daemon()
    tenv.run(daemon, seconds=2, cycles=2)
    job.refresh_from_db()
    assert job.state == "running"
    node = _node_of(job)
    _drain(tenv, node)
    with pg() as other, other.transaction():
        other.execute("SELECT id FROM scheduler_job WHERE id = %s FOR UPDATE", [job.pk])
        tenv.run(daemon, seconds=1)
        job.refresh_from_db()
        node.refresh_from_db()
        assert job.state == "running"
        assert node.drain_requested is True  # not cleared with the job still on the node
    tenv.run(daemon, seconds=1)
    job.refresh_from_db()
    node.refresh_from_db()
    assert job.state == "preempted"
    assert node.drain_requested is False
    assert_consistent(tenv.backend)


def test_a_binding_job_that_never_started_is_reclaimed(env: Env, settings: Any) -> None:
    """A member's job whose pods never start (a bad image) borrows GPUs; the lender's own
    job reclaims them at once: it is a victim in binding, with no work to lose, even inside
    the minimum runtime."""
    env.backend.start_delay_s = 10**9  # no pod starts in this test
    # 4 nodes x 8 = 32 H100; team-bravo's jobs fill all 32 (borrowing beyond its guarantee)
    borrowers = [env.submit(user="bob-bravo", resources={"gpus": 8}) for _ in range(4)]
    daemon = env.daemon()
    env.run(daemon)
    assert {Job.objects.get(pk=j.pk).state for j in borrowers} == {"binding"}
    mine = env.submit(resources={"gpus": 8})
    env.run(daemon, seconds=10)  # well inside the default minimum runtime (300 s)
    preempted = [j for j in borrowers if Job.objects.get(pk=j.pk).state == "preempted"]
    assert len(preempted) == 1
    assert JobEvent.objects.filter(job=preempted[0], from_state="binding").exists()
    env.run(daemon, seconds=3, cycles=2)
    mine.refresh_from_db()
    assert mine.state == "binding"
    assert_consistent(env.backend)
