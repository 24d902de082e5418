"""Quota validation: a table of valid and invalid trees, the database backstop, and a race.

The org fixture's H100-80GB quotas (GPUs guaranteed / limit):

    acme 64/64
    ├── research 32/64
    │   ├── team-alpha 16/32
    │   └── team-bravo 16/32
    └── product 32/64
        └── team-charlie 16/32

No tenant has an A100-40GB quota. Writes go through `quota_set` as pat, the platform admin, so
that only the rules of the tree (not permissions) decide.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from tenants import services
from tenants.models import Quota
from tenants.quotas import rules as quota_rules
from tenants.quotas.rules import QuotaValues, gpus
from tests import factories as f
from tests.conftest import Org


@pytest.fixture(autouse=True)
def fast_passwords(settings: Any) -> None:
    # The org fixture hashes a password per persona; the production hasher dominates runtime.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass(frozen=True)
class Write:
    """One quota write in GPUs: tenant (an Org attribute), guaranteed / limit, flavor."""

    tenant: str
    guaranteed: float
    limit: float
    lend: float | None = None
    weight: float = 1.0
    user_limit: float | None = None
    flavor: str = "h100"

    def values(self) -> QuotaValues:
        def milli(value: float | None) -> int | None:
            return None if value is None else round(value * 1000)

        return QuotaValues(
            guaranteed_milli=round(self.guaranteed * 1000),
            limit_milli=round(self.limit * 1000),
            lend_limit_milli=milli(self.lend),
            weight=self.weight,
            user_limit_milli=milli(self.user_limit),
        )


def apply(org: Org, write: Write) -> Quota:
    return services.quota_set(
        user=org.users["pat"],
        tenant=getattr(org, write.tenant),
        flavor=getattr(org, write.flavor),
        values=write.values(),
    )


def all_quotas() -> list[tuple[Any, ...]]:
    return list(
        Quota.objects.order_by("tenant__slug", "flavor__name").values_list(
            "tenant__slug",
            "flavor__name",
            "guaranteed_milli",
            "limit_milli",
            "lend_limit_milli",
            "weight",
            "user_limit_milli",
        )
    )


def test_gpus_says_numbers_as_people_do() -> None:
    assert [gpus(m) for m in (0, 500, 1000, 2500, 16000)] == [
        "0 GPUs",
        "0.5 GPUs",
        "1 GPU",
        "2.5 GPUs",
        "16 GPUs",
    ]


VALID = [
    pytest.param([Write("alpha", 8, 32)], id="lower-a-team-guarantee"),
    pytest.param([Write("alpha", 16, 16)], id="limit-equal-to-guarantee"),
    pytest.param([Write("alpha", 0, 0)], id="all-zero"),
    # research's limit is 64, so a team may borrow up to it
    pytest.param([Write("alpha", 16, 64)], id="team-limit-equal-to-parent-limit"),
    pytest.param([Write("alpha", 16, 32, lend=16)], id="lend-all-of-the-guarantee"),
    pytest.param([Write("alpha", 16, 32, lend=0)], id="lend-nothing"),
    pytest.param([Write("alpha", 16, 32, weight=0.25)], id="small-positive-weight"),
    pytest.param([Write("alpha", 16, 32, user_limit=32)], id="user-limit-equal-to-limit"),
    # 8 (bravo) + 24 (alpha) = 32 = research's guarantee, exactly full
    pytest.param([Write("bravo", 8, 32), Write("alpha", 24, 32)], id="siblings-exactly-fill"),
    # 16 + 15.5 = 31.5 <= 32, in milli-GPU: 16000 + 15500 = 31500
    pytest.param([Write("bravo", 15.5, 32), Write("alpha", 16.5, 32)], id="fractional-gpus"),
    # the children's guarantees sum to 16 + 16 = 32 and their limits are 32: both still fit
    pytest.param([Write("research", 32, 32)], id="parent-lowered-onto-its-children"),
    pytest.param([Write("acme", 128, 128), Write("research", 64, 128)], id="raise-top-down"),
    pytest.param([Write("acme", 8, 16, flavor="a100")], id="root-gets-a-new-flavor"),
    # research has no A100 quota: a child may still hold a zero guarantee for it
    pytest.param([Write("alpha", 0, 0, flavor="a100")], id="zero-guarantee-under-no-quota"),
    pytest.param(
        [
            Write("acme", 16, 16, flavor="a100"),
            Write("research", 8, 16, flavor="a100"),
            Write("alpha", 8, 16, flavor="a100"),
        ],
        id="new-flavor-down-the-tree",
    ),
]


@pytest.mark.parametrize("writes", VALID)
def test_valid_quota_trees_are_saved(org: Org, writes: list[Write]) -> None:
    for write in writes:
        apply(org, write)
    for write in writes:
        row = Quota.objects.get(
            tenant=getattr(org, write.tenant), flavor=getattr(org, write.flavor)
        )
        expected = write.values()
        assert (
            row.guaranteed_milli,
            row.limit_milli,
            row.lend_limit_milli,
            row.user_limit_milli,
        ) == (
            expected.guaranteed_milli,
            expected.limit_milli,
            expected.lend_limit_milli,
            expected.user_limit_milli,
        )
        assert row.weight == Decimal(str(write.weight))
    assert Quota.objects.filter(tenant=org.alpha, flavor=org.h100).count() == 1


# (writes that succeed first, the refused write, the field blamed, what its message must say)
INVALID = [
    pytest.param(
        [],
        Write("alpha", 16, 8),
        "limit_milli",
        ["team-alpha", "limit", "8 GPUs", "16 GPUs"],
        id="limit-below-guarantee",
    ),
    pytest.param(
        [],
        Write("alpha", 16, 32, lend=20),
        "lend_limit_milli",
        ["team-alpha", "20 GPUs", "16 GPUs"],
        id="lend-limit-above-guarantee",
    ),
    pytest.param(
        [],
        Write("alpha", 16, 32, weight=0),
        "weight",
        ["team-alpha", "above 0", "got 0"],
        id="weight-zero",
    ),
    pytest.param(
        [],
        Write("alpha", 16, 32, weight=-1),
        "weight",
        ["team-alpha", "got -1"],
        id="weight-negative",
    ),
    pytest.param(
        [],
        Write("alpha", 16, 32, user_limit=40),
        "user_limit_milli",
        ["team-alpha", "40 GPUs", "32 GPUs"],
        id="user-limit-above-limit",
    ),
    # 24 (alpha) + 16 (bravo) = 40 > 32 (research)
    pytest.param(
        [],
        Write("alpha", 24, 32),
        "guaranteed_milli",
        ["research", "40 GPUs", "team-alpha 24 GPUs", "team-bravo 16 GPUs", "32 GPUs"],
        id="children-guarantees-exceed-parent",
    ),
    # 16.5 + 16 = 32.5 > 32: half a GPU too many is still too many
    pytest.param(
        [],
        Write("alpha", 16.5, 32),
        "guaranteed_milli",
        ["research", "32.5 GPUs", "team-alpha 16.5 GPUs", "32 GPUs"],
        id="children-exceed-by-half-a-gpu",
    ),
    # bravo was lowered to 8: 8 + 25 = 33 > 32
    pytest.param(
        [Write("bravo", 8, 32)],
        Write("alpha", 25, 32),
        "guaranteed_milli",
        ["research", "33 GPUs", "team-alpha 25 GPUs", "team-bravo 8 GPUs"],
        id="children-exceed-after-a-sibling-change",
    ),
    pytest.param(
        [],
        Write("alpha", 16, 80),
        "limit_milli",
        ["team-alpha", "80 GPUs", "research", "64 GPUs"],
        id="limit-above-parent-limit",
    ),
    # research's children are guaranteed 16 + 16 = 32 > 24
    pytest.param(
        [],
        Write("research", 24, 64),
        "guaranteed_milli",
        ["research", "24 GPUs", "32 GPUs", "team-alpha 16 GPUs + team-bravo 16 GPUs"],
        id="parent-lowered-below-children-sum",
    ),
    # acme's children are guaranteed 32 + 32 = 64 > 48
    pytest.param(
        [],
        Write("acme", 48, 64),
        "guaranteed_milli",
        ["acme", "48 GPUs", "64 GPUs", "product 32 GPUs + research 32 GPUs"],
        id="root-lowered-below-children-sum",
    ),
    # alpha's limit was raised to 48, so research's limit cannot drop to 40
    pytest.param(
        [Write("alpha", 16, 48)],
        Write("research", 32, 40),
        "limit_milli",
        ["research", "40 GPUs", "team-alpha 48 GPUs"],
        id="parent-limit-below-a-child-limit",
    ),
    pytest.param(
        [],
        Write("alpha", 4, 8, flavor="a100"),
        "guaranteed_milli",
        ["team-alpha", "4 GPUs", "research", "holds no A100-40GB quota", "quota for A100-40GB"],
        id="guarantee-under-parent-without-flavor",
    ),
    # research holds no A100 quota: it has none to give, so a child may not borrow more
    # than research would (a limit is a quota too); only 0/0 may be set beneath it
    pytest.param(
        [],
        Write("alpha", 0, 8, flavor="a100"),
        "limit_milli",
        ["team-alpha", "limit of 8 GPUs", "research", "holds no A100-40GB quota", "borrow"],
        id="limit-under-parent-without-flavor",
    ),
    pytest.param(
        [Write("acme", 16, 16, flavor="a100")],
        Write("research", 20, 16, flavor="a100"),
        "limit_milli",
        ["research", "16 GPUs", "20 GPUs"],
        id="new-flavor-limit-below-guarantee",
    ),
]


@pytest.mark.parametrize(("setup", "write", "field", "fragments"), INVALID)
def test_invalid_quota_is_refused_with_numbers_and_changes_nothing(
    org: Org, setup: list[Write], write: Write, field: str, fragments: list[str]
) -> None:
    for earlier in setup:
        apply(org, earlier)
    before = all_quotas()
    with pytest.raises(ValidationError) as info:
        apply(org, write)
    errors = info.value.message_dict
    assert field in errors, errors
    message = " ".join(errors[field])
    missing = [text for text in fragments if text not in message]
    assert not missing, f"{missing} not in {message!r}"
    assert all_quotas() == before


def test_team_admin_cannot_give_a_child_quota_on_a_model_the_team_has_none_of(
    org: Org, client_for: Any
) -> None:
    # dana administers research, which holds no A100 quota; team-alpha is research's child
    before = all_quotas()
    response = client_for("dana").post(
        "/api/v1/quotas/",
        {
            "tenant": org.alpha.pk,
            "flavor": org.a100.pk,
            "guaranteed_milli": 0,
            "limit_milli": 8000,
            "weight": 1.0,
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    body = response.json()
    assert set(body["errors"]) == {"limit_milli"}
    assert "'research' holds no A100-40GB quota" in body["errors"]["limit_milli"][0]
    assert all_quotas() == before


def test_a_parent_quota_cannot_be_deleted_while_a_child_holds_one(org: Org) -> None:
    apply(org, Write("acme", 16, 16, flavor="a100"))
    apply(org, Write("research", 8, 16, flavor="a100"))
    apply(org, Write("alpha", 0, 8, flavor="a100"))  # borrowing up to 8, nothing guaranteed
    research = Quota.objects.get(tenant=org.research, flavor=org.a100)
    with pytest.raises(ValidationError, match="team-alpha"):
        services.quota_delete(user=org.users["pat"], quota=research)
    assert Quota.objects.filter(pk=research.pk).exists()
    # a 0/0 child (no borrowing) does not hold the parent's quota up
    apply(org, Write("alpha", 0, 0, flavor="a100"))
    services.quota_delete(user=org.users["pat"], quota=research)
    assert not Quota.objects.filter(pk=research.pk).exists()


def test_several_broken_rules_are_all_reported(org: Org) -> None:
    # guaranteed 40 > limit 36; 40 + 16 = 56 > research's 32; lend 48 > 40; weight 0
    with pytest.raises(ValidationError) as info:
        apply(org, Write("alpha", 40, 36, lend=48, weight=0))
    assert set(info.value.message_dict) == {
        "limit_milli",
        "lend_limit_milli",
        "weight",
        "guaranteed_milli",
    }


# --- the database backstop -----------------------------------------------------------------


CONSTRAINTS = [
    pytest.param({"limit_milli": 8000}, "quota_limit_at_least_guaranteed", id="limit-below"),
    pytest.param(
        {"lend_limit_milli": 16001}, "quota_lend_limit_within_guaranteed", id="lend-above"
    ),
    pytest.param({"weight": 0}, "quota_weight_positive", id="weight-zero"),
    pytest.param({"weight": -2}, "quota_weight_positive", id="weight-negative"),
    pytest.param(
        {"guaranteed_milli": -1000, "limit_milli": 0}, "guaranteed_milli", id="negative-guarantee"
    ),
]


@pytest.mark.parametrize(("fields", "constraint"), CONSTRAINTS)
def test_database_refuses_an_impossible_quota(
    org: Org, fields: dict[str, Any], constraint: str
) -> None:
    quota = Quota.objects.get(tenant=org.alpha, flavor=org.h100)  # 16/32
    before = all_quotas()
    with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
        Quota.objects.filter(pk=quota.pk).update(**fields)  # bypasses every Python check
    assert all_quotas() == before


def test_database_refuses_a_second_quota_for_the_same_flavor(org: Org) -> None:
    with (
        pytest.raises(
            IntegrityError,
            # PostgreSQL names the constraint, SQLite its columns
            match=r"quota_one_global_per_flavor|UNIQUE constraint failed: tenants_quota\.tenant_id",
        ),
        transaction.atomic(),
    ):
        f.QuotaFactory(tenant=org.alpha, flavor=org.h100, guaranteed_milli=0, limit_milli=0)
    assert Quota.objects.filter(tenant=org.alpha, flavor=org.h100).count() == 1


# --- two sibling raises at once ------------------------------------------------------------


@pytest.mark.postgresql("waits on the other transaction's row lock (pg_blocking_pids)")
def test_concurrent_sibling_raises_cannot_both_squeeze_in(
    transactional_db: Any,
    org: Org,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Make room: alpha 8 + bravo 8 = 16 of research's 32. Each raise to 20 fits alone
    # (20 + 8 = 28 <= 32) but both together do not (20 + 20 = 40 > 32).
    apply(org, Write("alpha", 8, 32))
    apply(org, Write("bravo", 8, 32))

    start = threading.Barrier(2, timeout=10)
    pids: dict[str, int] = {}
    validated: dict[str, threading.Event] = {"alpha": threading.Event(), "bravo": threading.Event()}
    original = quota_rules.check_against_parent

    def blocked_by(waiter: int, holder: int) -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT %s = ANY(pg_blocking_pids(%s))", [holder, waiter])
            return bool(cursor.fetchone()[0])

    def check_then_hold(tenant: Any, *args: Any, **kwargs: Any) -> Any:
        # Force the dangerous interleaving: the first thread to validate holds its
        # transaction open until the other has either validated too (no lock: both read
        # the old siblings, the bug) or is waiting on this transaction's lock (the fix).
        me = "alpha" if tenant.slug == "team-alpha" else "bravo"
        other = "bravo" if me == "alpha" else "alpha"
        result = original(tenant, *args, **kwargs)
        validated[me].set()
        while not validated[other].is_set() and not blocked_by(pids[other], pids[me]):
            validated[other].wait(0.01)
        return result

    monkeypatch.setattr(quota_rules, "check_against_parent", check_then_hold)

    def raise_to_20(name: str) -> Any:
        def call() -> Any:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids[name] = cursor.fetchone()[0]
            start.wait()
            return apply(org, Write(name, 20, 32))

        return call

    results: dict[str, Any] = {}

    def runner(name: str) -> None:
        try:
            results[name] = raise_to_20(name)()
        except Exception as exc:
            results[name] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=runner, args=(n,)) for n in ("alpha", "bravo")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a thread hung"

    refused = [r for r in results.values() if isinstance(r, ValidationError)]
    saved = [r for r in results.values() if isinstance(r, Quota)]
    assert (len(saved), len(refused)) == (1, 1), results
    assert "guaranteed_milli" in refused[0].message_dict
    assert "40 GPUs" in " ".join(refused[0].message_dict["guaranteed_milli"])  # 20 + 20
    rows = dict(
        Quota.objects.filter(tenant__parent=org.research, flavor=org.h100).values_list(
            "tenant__slug", "guaranteed_milli"
        )
    )
    assert sorted(rows.values()) == [8000, 20000]  # the winner's 20 and the loser's old 8
    assert sum(rows.values()) <= 32000
