"""What-if replays carry today's quotas pinned to a cluster (issue 38): the replay's tenants
are built as the daemon's snapshot builds them, pins under their own keys, and a proposed
change of a global quota leaves the pins as they are."""

from __future__ import annotations

from scheduler.core.quota import pinned_key
from scheduler.core.types import Quota
from whatif.replay import OrgRows, organisation


def quota(slug: str, cluster: str | None, guaranteed: int, limit: int) -> dict[str, object]:
    return {
        "tenant__slug": slug,
        "flavor__name": "H100",
        "cluster__name": cluster,
        "guaranteed_milli": guaranteed,
        "limit_milli": limit,
        "lend_limit_milli": None,
        "weight": 1,
        "user_limit_milli": None,
    }


def test_a_replay_keeps_the_pins_beside_a_proposed_global_change() -> None:
    rows = OrgRows(
        [{"id": 1, "slug": "org", "parent_id": None}, {"id": 2, "slug": "team", "parent_id": 1}],
        [quota("team", None, 8000, 16000), quota("team", "site-b", 4000, 8000)],
        [],
    )
    change = {"kind": "quota", "tenant": "team", "flavor": "H100", "guaranteed_milli": 12000}
    tenants, _ = organisation(rows, [change])
    team = next(t for t in tenants if t.name == "team")
    assert team.quotas == {"H100": Quota(12000, 16000, None)}
    assert dict(team.pinned) == {pinned_key("H100", "site-b"): Quota(4000, 8000)}


def test_a_proposed_pinned_change_changes_that_pin_only() -> None:
    rows = OrgRows(
        [{"id": 1, "slug": "org", "parent_id": None}, {"id": 2, "slug": "team", "parent_id": 1}],
        [quota("team", None, 8000, 16000), quota("team", "site-b", 4000, 8000)],
        [],
    )
    change = {
        "kind": "quota",
        "tenant": "team",
        "flavor": "H100",
        "cluster": "site-b",
        "guaranteed_milli": 6000,
    }
    tenants, _ = organisation(rows, [change])
    team = next(t for t in tenants if t.name == "team")
    assert team.quotas == {"H100": Quota(8000, 16000, None)}
    assert dict(team.pinned) == {pinned_key("H100", "site-b"): Quota(6000, 8000)}
