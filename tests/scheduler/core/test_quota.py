"""Quota admission up the tenant tree: guarantee, borrowing, limit, lend limit, user caps."""

from __future__ import annotations

import pytest

from scheduler.core.quota import QuotaLedger
from scheduler.core.types import Quota, Tenant, WaitCode
from tests.scheduler.core.builders import (
    GPU,
    cycle,
    make_job,
    make_node,
    make_running,
    make_tenants,
    snapshot,
)


def ledger(
    *teams: tuple[str, float, float | None], lend: dict[str, float] | None = None
) -> QuotaLedger:
    return QuotaLedger(make_tenants(*teams, lend_limits=lend), ["H100"])


# (id, teams, usage already charged per team in GPUs, request (team, GPUs), fits?)
CASES = [
    # a: 0 + 8 <= guarantee 8
    ("within-guarantee", [("a", 8, 16), ("b", 8, 16)], {}, ("a", 8), True),
    # a: 8 + 4 = 12 <= limit 16; cohort pool: max(12,0) + max(0,0) = 12 <= 16 (b idle)
    ("borrow-idle", [("a", 8, 16), ("b", 8, 16)], {"a": 8}, ("a", 4), True),
    # a: 16 + 1 = 17 > limit 16
    ("over-limit", [("a", 8, 16), ("b", 8, 16)], {"a": 16}, ("a", 1), False),
    # b uses its 8, a at 8: pool 8 + 8 = 16, +1 = 17 > cohort 16: nothing idle to borrow
    ("nothing-idle", [("a", 8, 16), ("b", 8, 16)], {"a": 8, "b": 8}, ("a", 1), False),
    # b borrowed a's 8 (uses 16): a asks for its own guarantee: 16 + 1 > 16, reclaim needed
    ("guarantee-lent-out", [("a", 8, 16), ("b", 8, 16)], {"b": 16}, ("a", 1), False),
    # limit None: only the cohort bounds it: 0 + 16 <= 16
    ("no-limit-borrows-all", [("a", 8, None), ("b", 8, None)], {}, ("a", 16), True),
]


@pytest.mark.parametrize(
    ("teams", "usage", "request_", "fits"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_admission_table(teams, usage, request_, fits):
    book = ledger(*teams)
    for team, used in usage.items():
        book.charge(team, "", "H100", round(used * GPU))
    team, gpus = request_
    assert (book.check(team, "", "H100", round(gpus * GPU)) is None) is fits


def test_lend_limit_keeps_part_of_the_guarantee_home():
    # b guarantees 8 but lends at most 2: a may borrow 2, not 3.
    # pool: max(u_a, 8 - 8) + max(u_b, 8 - 2) = u_a + 6 <= 16  ->  u_a <= 10
    book = ledger(("a", 8, None), ("b", 8, None), lend={"b": 2})
    assert book.check("a", "", "H100", 10 * GPU) is None
    assert book.check("a", "", "H100", 11 * GPU) is not None


def dept_tree(dept_limit: float | None) -> tuple[Tenant, ...]:
    limit = None if dept_limit is None else round(dept_limit * GPU)
    return (
        Tenant("org"),
        Tenant("dept", "org", {"H100": Quota(8 * GPU, limit)}),
        Tenant("a", "dept", {"H100": Quota(4 * GPU, 8 * GPU)}),
        Tenant("b", "dept", {"H100": Quota(4 * GPU, 8 * GPU)}),
        Tenant("other", "org", {"H100": Quota(8 * GPU, 16 * GPU)}),
    )


@pytest.mark.parametrize(
    ("dept_limit", "fits"),
    [
        # dept: 6 + 3 = 9 > its limit 8, although "other" leaves 8 idle
        pytest.param(8, False, id="dept-limit-binds-subtree"),
        # no dept limit: org footprint 9 + other's 0 = 9 <= org 16: dept borrows from other
        pytest.param(None, True, id="subtree-borrows-across-tree"),
    ],
)
def test_hierarchical_borrowing(dept_limit, fits):
    book = QuotaLedger(dept_tree(dept_limit), ["H100"])
    book.charge("a", "", "H100", 6 * GPU)
    verdict = book.check("b", "", "H100", 3 * GPU)
    assert (verdict is None) is fits
    if not fits:
        assert verdict is not None and verdict.tenant == "dept"


def test_user_cap_inside_a_tenant():
    book = QuotaLedger(make_tenants(("a", 16, None), user_caps={"a": 4}), ["H100"])
    book.charge("a", "alice", "H100", 3 * GPU)
    verdict = book.check("a", "alice", "H100", 2 * GPU)  # 3 + 2 = 5 > cap 4
    assert verdict is not None and verdict.user_cap
    assert book.check("a", "bob", "H100", 2 * GPU) is None  # bob uses 0


def test_user_caps_are_per_flavor_and_a_cap_of_zero_holds():
    # alice may hold 4 H100 and no A100 in team a; what she holds of one model does not
    # count against the other's cap (one cap per tenant once collapsed them to the lowest
    # and dropped a 0).
    h100, a100 = Quota(16 * GPU, None), Quota(16 * GPU, None)
    tenants = (
        Tenant("org"),
        Tenant("a", "org", {"H100": h100, "A100": a100}, user_caps={"H100": 4 * GPU, "A100": 0}),
    )
    book = QuotaLedger(tenants, ["H100", "A100"])
    book.charge("a", "alice", "H100", 4 * GPU)
    verdict = book.check("a", "alice", "A100", 1 * GPU)  # 0 + 1 > cap 0
    assert verdict is not None and verdict.user_cap and "A100" in verdict.message
    assert book.check("a", "alice", "H100", 1 * GPU) is not None  # 4 + 1 > 4
    assert book.check("a", "bob", "H100", 4 * GPU) is None


def test_rollback_restores_usage():
    book = ledger(("a", 8, 16), ("b", 8, 16))
    mark = book.mark()
    book.charge("a", "", "H100", 16 * GPU)
    book.rollback(mark)
    assert book.usage[("a", "H100")] == 0
    assert book.check("b", "", "H100", 16 * GPU) is None


def test_quota_reason_names_tenant_usage_and_limit():
    # team-a: guarantee 16, limit 16, runs 16 H100 already; a 4-GPU job must wait.
    tenants = make_tenants(("team-a", 16, 16), ("team-b", 16, None))
    nodes = [make_node(f"n{i}") for i in range(4)]
    running = [
        make_running(make_job("r1", gpus=8), ("n0", range(8))),
        make_running(make_job("r2", gpus=8), ("n1", range(8))),
    ]
    result = cycle(snapshot(nodes, [make_job("j", gpus=4)], running, tenants=tenants))
    reason = result.reason_for("j")
    assert reason is not None and reason.code == WaitCode.QUOTA
    assert reason.message == (
        "quota: team-a has 16 of its H100 limit of 16 in use (16 guaranteed); this job needs 4"
    )


def test_best_effort_is_not_charged_but_uses_only_idle_devices():
    # team-a is at its limit 8, yet its best-effort job runs on idle devices.
    tenants = make_tenants(("team-a", 8, 8), ("team-b", 8, None))
    nodes = [make_node("n0"), make_node("n1")]
    running = [make_running(make_job("r", gpus=8), ("n0", range(8)))]
    pending = [make_job("be", gpus=8, priority="best-effort"), make_job("q", gpus=1)]
    result = cycle(snapshot(nodes, pending, running, tenants=tenants))
    assert result.placement_for("be") is not None
    assert result.reason_for("q") is not None and result.reason_for("q").code == WaitCode.QUOTA


def test_user_cap_reason_through_a_cycle():
    # alice may hold 4 GPUs in team-a: her 3-GPU job runs, her next 2-GPU job waits (3 + 2 > 4)
    # while bob's 2-GPU job of the same tenant runs
    tenants = make_tenants(("team-a", 16, None), ("team-b", 8, None), user_caps={"team-a": 4})
    pending = [
        make_job("a1", gpus=3, user="alice", submitted_at=0),
        make_job("a2", gpus=2, user="alice", submitted_at=1),
        make_job("b1", gpus=2, user="bob", submitted_at=2),
    ]
    result = cycle(snapshot([make_node("n1")], pending, tenants=tenants))
    assert {p.job_id for p in result.placements} == {"a1", "b1"}
    reason = result.reason_for("a2")
    assert reason is not None and reason.code == WaitCode.USER_CAP
    assert reason.message == "user cap: alice uses 3 H100 in team-a, cap 4, job needs 2"


# --- a tenant without quota on a flavor: borrowing only (as a Kueue ClusterQueue with
# nominalQuota 0 in its cohort) -------------------------------------------------------------


def borrower_tree() -> tuple[Tenant, ...]:
    """org guarantees 16 H100; "owner" 16 of them; "nobody" holds no H100 quota."""
    return (
        Tenant("org", None, {"H100": Quota(16 * GPU)}),
        Tenant("owner", "org", {"H100": Quota(16 * GPU, 16 * GPU)}),
        Tenant("nobody", "org"),
    )


def test_a_tenant_without_quota_borrows_idle_capacity_and_is_reclaimed_first():
    nodes = [make_node("n1"), make_node("n2")]
    tenants = borrower_tree()
    # owner idle: nobody borrows all 16 (0 guaranteed + 16 borrowed <= org's 16)
    idle = cycle(
        snapshot(nodes, [make_job("x", "nobody", gpus=8, replicas=2)], tenants=tenants, now=1e4)
    )
    assert idle.placement_for("x") is not None
    # owner asks for its guarantee back: nobody's job is reclaimed, whatever its priority
    running = [
        make_running(make_job(f"x{i}", "nobody", gpus=8, priority="high"), (f"n{i}", range(8)))
        for i in (1, 2)
    ]
    snap = snapshot(nodes, [make_job("o", "owner", gpus=8)], running, tenants=tenants, now=1e4)
    result = cycle(snap)
    assert result.placement_for("o") is not None
    assert len(result.preemptions) == 1 and "reclaims" in result.preemptions[0].reason


def test_a_tenant_without_quota_is_told_it_may_only_borrow():
    book = QuotaLedger(borrower_tree(), ["H100"])
    book.charge("owner", "", "H100", 16 * GPU)
    verdict = book.check("nobody", "", "H100", 8 * GPU)
    assert verdict is not None
    assert verdict.message == (
        "quota: nobody holds no H100 guarantee and may only borrow; this job needs 8, and only "
        "0 H100 of other teams' guarantees is idle to lend"
    )


def test_a_quota_below_a_parent_without_quota_guarantees_nothing():
    # "dept" holds no H100 quota, yet "team" has a row guaranteeing 8 (written before
    # quota_set refused it). That 8 is not carved out of anything: team borrows like its
    # parent, so "other", guaranteed all 16 of org, reclaims team's job instead of waiting.
    tenants = (
        Tenant("org", None, {"H100": Quota(16 * GPU, 16 * GPU)}),
        Tenant("dept", "org"),
        Tenant("team", "dept", {"H100": Quota(8 * GPU, 16 * GPU)}),
        Tenant("other", "org", {"H100": Quota(16 * GPU, 16 * GPU)}),
    )
    book = QuotaLedger(tenants, ["H100"])
    assert (book.guarantee("team", "H100"), book.guarantee("dept", "H100")) == (0, 0)
    assert book.guarantee("other", "H100") == 16 * GPU
    nodes = [make_node("n1"), make_node("n2")]
    running = [make_running(make_job("t", "team", gpus=8), ("n1", range(8)))]
    pending = [make_job("o", "other", gpus=8, replicas=2)]
    result = cycle(snapshot(nodes, pending, running, tenants=tenants, now=1e4))
    assert result.placement_for("o") is not None
    assert {p.job_id for p in result.preemptions} == {"t"}


def test_a_root_without_quota_is_a_cohort_of_its_childrens_guarantees():
    # no row on org: its capacity is a's 8 + b's 8 (the benches' and kueue's cohorts)
    book = ledger(("a", 8, None), ("b", 8, None))
    assert book.guarantee("org", "H100") == 16 * GPU
    assert book.guarantee("a", "H100") == 8 * GPU
