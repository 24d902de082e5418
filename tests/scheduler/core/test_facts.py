"""A pending job's facts (`scheduler.core.facts`): worked out once per job object, kept with the
held base between cycles, dropped with it."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core import run_cycle
from scheduler.core.context import Held
from scheduler.core.cycle import build_context
from scheduler.core.types import WaitCode
from tests.scheduler.core.builders import (
    BEST_FIT,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)


def test_a_jobs_facts_are_kept_for_the_same_job_object_only():
    job = make_job("j", gpus=2)
    ctx = build_context(snapshot([make_node("n1")], [job]), BEST_FIT)
    facts = ctx.facts.of(ctx, job)
    assert ctx.facts.of(ctx, job) is facts
    bigger = replace(job, resources=replace(job.resources, gpu_milli=4000))  # its row changed
    again = ctx.facts.of(ctx, bigger)
    assert again is not facts and again.milli == 4000
    assert again.request != facts.request  # another request: another memo key


def test_equal_requests_share_their_keys_and_other_teams_do_not():
    jobs = [make_job("a1", gpus=2), make_job("a2", gpus=2), make_job("b1", gpus=2, tenant="team-b")]
    ctx = build_context(snapshot([make_node("n1")], jobs), BEST_FIT)
    a1, a2, b1 = (ctx.facts.of(ctx, job) for job in jobs)
    assert (a1.request, a1.asker) == (a2.request, a2.asker)
    assert a1.request != b1.request and a1.asker != b1.asker


def test_the_facts_go_with_the_held_base_when_the_tenants_change():
    """A job of a team the engine does not know is invalid; once the team exists (the held
    base is rebuilt for the new tenants), the very same job object is placed: its facts were
    not kept across the change."""
    job = make_job("j", tenant="team-c")
    nodes = [make_node("n1")]
    held = Held()
    first = run_cycle(snapshot(nodes, [job]), BEST_FIT, held=held)
    reason = first.reason_for("j")
    assert reason is not None and reason.code == WaitCode.INVALID
    tenants = make_tenants(("team-a", 64, None), ("team-b", 64, None), ("team-c", 64, None))
    second = run_cycle(snapshot(nodes, [job], tenants=tenants), BEST_FIT, held=held)
    assert second.placement_for("j") is not None


def test_the_facts_of_jobs_that_left_the_queue_are_forgotten():
    held = Held()
    nodes = [make_node("n1")]
    first, second = make_job("first", gpus=8), make_job("second", gpus=8)
    run_cycle(snapshot(nodes, [first, second]), BEST_FIT, held=held)
    kept = held.facts._by_job
    assert set(kept) == {"first", "second"}
    run_cycle(snapshot(nodes, [second]), BEST_FIT, held=held)
    assert set(held.facts._by_job) == {"second"}


def test_a_number_is_never_given_to_two_requests(monkeypatch):
    """Keys are forgotten past `MAX_KEYS`, their numbers are not given again: a job whose
    facts were worked out before (and whose number may be in the cycle's memo) never shares
    it with another request."""
    from scheduler.core import facts as module

    monkeypatch.setattr(module, "MAX_KEYS", 2)  # each job's facts number two keys
    a, b = make_job("a", gpus=1), make_job("b", gpus=2)
    ctx = build_context(snapshot([make_node("n1")], [a, b]), BEST_FIT)
    before = ctx.facts.of(ctx, a)
    after = ctx.facts.of(ctx, b)  # the keys are forgotten here
    assert {before.request, before.asker}.isdisjoint({after.request, after.asker})


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.sampled_from(range(12)), max_size=8),  # pending: job numbers
            st.lists(st.sampled_from(range(12)), max_size=4, unique=True),  # running
            st.sets(st.sampled_from(range(12)), max_size=3),  # rows changed since
        ),
        min_size=1,
        max_size=6,
    )
)
def test_the_mix_kept_with_the_base_is_the_mix_of_the_cycles_jobs(cycles):
    """The request mix the fragmentation scorer weighs, kept with the held base from what
    came, went, started, stopped or changed, is at every cycle the count of the cycle's
    pending and running jobs' (resources, flavors), a job listed twice counted twice."""
    shapes = [(1, ()), (2, ()), (0.5, ()), (1, ("A100",))]
    made: dict[int, object] = {}

    def job(n: int, changed: set[int]) -> object:
        if n not in made or n in changed:  # a changed row is a new object, maybe a new shape
            gpus, flavors = shapes[(n + len(changed)) % len(shapes)]
            made[n] = make_job(f"j{n}", gpus=gpus, flavors=flavors)
        return made[n]

    held = Held()
    for pending_ids, running_ids, changed in cycles:
        pending = [job(n, changed) for n in pending_ids]
        running = [make_running(job(n, changed), ("n1", [0])) for n in running_ids]
        snap = snapshot([make_node("n1")], pending, running)
        build_context(snap, BEST_FIT, held)
        everyone = [*pending, *(r.job for r in running)]
        assert held.mix.of(pending) == Counter((j.resources, j.flavors) for j in everyone)
