"""`gantry quota-requests` against a live server (issue 38): a team admin asks for a global and
a pinned quota of one flavor at once, the admin above sees them in the inbox and decides each;
a twin request, an unknown cluster and an impossible value are said plainly.

The org fixture's H100 quotas (GPUs guaranteed / limit): research 32/64, team-alpha 16/32.
tina administers team-alpha; dana administers research and decides; alice is a member."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.models import Cluster
from tenants.models import ApprovalRequest, Quota
from tests.conftest import Org

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def site_b(db: Any) -> Cluster:
    return Cluster.objects.create(name="site-b", backend="simulated")


def ask(gantry: Any, *extra: str) -> tuple[int, str, str]:
    return gantry("tina", "--json", "quota-requests", "create", "--flavor", "H100-80GB", *extra)


def test_a_global_and_a_pinned_request_are_asked_listed_and_decided(
    gantry: Any, org: Org, site_b: Cluster
) -> None:
    code, out, err = ask(gantry, "--gpus", "12", "--limit", "40", "--reason", "fewer evals")
    assert code == 0, err
    global_id = json.loads(out)["id"]
    code, out, err = ask(gantry, "--gpus", "8", "--cluster", "site-b", "--reason", "near data")
    assert code == 0, err
    pinned = json.loads(out)
    assert pinned["payload"]["cluster_name"] == "site-b"
    # no limit given: the pin has none yet, so the guarantee
    assert pinned["payload"]["values"]["limit_milli"] == 8000
    # tina's own, as a table: the cluster column says which is pinned
    code, out, err = gantry("tina", "quota-requests")
    assert code == 0, err
    header, *lines = out.splitlines()
    assert header.split()[:6] == ["ID", "STATE", "TENANT", "FLAVOR", "CLUSTER", "GPUS"]
    assert [line.split()[:6] for line in lines] == [
        [str(pinned["id"]), "pending", "team-alpha", "H100-80GB", "site-b", "8"],
        [str(global_id), "pending", "team-alpha", "H100-80GB", "(all)", "12"],
    ]
    # dana decides both: approve one, reject the other with a reason
    code, out, err = gantry("dana", "--json", "quota-requests", "--inbox")
    assert code == 0, err
    assert sorted(r["id"] for r in json.loads(out)) == sorted([global_id, pinned["id"]])
    code, _, err = gantry("dana", "quota-requests", "approve", str(pinned["id"]))
    assert code == 0, err
    code, _, err = gantry(
        "dana", "quota-requests", "reject", str(global_id), "--reason", "not this quarter"
    )
    assert code == 0, err
    assert Quota.objects.get(tenant=org.alpha, cluster=site_b).guaranteed_milli == 8000
    assert Quota.objects.get(tenant=org.alpha, cluster=None).guaranteed_milli == 16000
    code, out, _ = gantry("tina", "--json", "quota-requests")
    states = {r["id"]: (r["state"], r["comment"]) for r in json.loads(out)}
    assert states == {pinned["id"]: ("approved", ""), global_id: ("rejected", "not this quarter")}


def test_a_global_request_keeps_the_values_it_does_not_change(gantry: Any, org: Org) -> None:
    Quota.objects.filter(tenant=org.alpha, cluster=None).update(weight=2.5)
    code, out, err = ask(gantry, "--gpus", "12", "--reason", "fewer evals")
    assert code == 0, err
    made = json.loads(out)
    # it names the guarantee only: the limit (32 GPUs, above 12) need not rise
    assert made["payload"]["values"] == {"guaranteed_milli": 12000}
    # the weight changed after the request is kept when it is approved
    Quota.objects.filter(tenant=org.alpha, cluster=None).update(weight=3.5)
    code, _, err = gantry("dana", "quota-requests", "approve", str(made["id"]))
    assert code == 0, err
    quota = Quota.objects.get(tenant=org.alpha, cluster=None)
    assert (quota.guaranteed_milli, quota.limit_milli, float(quota.weight)) == (12000, 32000, 3.5)


def test_a_twin_request_is_refused_with_the_pending_ones_number(
    gantry: Any, site_b: Cluster
) -> None:
    code, out, err = ask(gantry, "--gpus", "8", "--cluster", "site-b", "--reason", "near data")
    assert code == 0, err
    first = json.loads(out)["id"]
    code, _, err = ask(gantry, "--gpus", "6", "--cluster", "site-b", "--reason", "or less")
    assert code == 1
    assert err.startswith(
        "HTTP 409: A quota request for H100-80GB on cluster site-b of 'team-alpha' is already "
        f"pending (#{first})"
    )
    assert ApprovalRequest.objects.count() == 1


@pytest.mark.parametrize(
    ("user", "argv", "code", "said"),
    [
        ("tina", ["--gpus", "8", "--cluster", "nowhere"], 2, "no cluster named 'nowhere'"),
        ("tina", ["--gpus", "-1"], 2, "--gpus must be 0 or more GPUs, not -1."),
        ("tina", ["--gpus", "40"], 1, "guaranteed_milli: "),  # above research's 32
        ("alice", ["--gpus", "8"], 2, "you administer no tenant: name the tenant with --tenant"),
        ("alice", ["--gpus", "8", "--tenant", "team-alpha"], 1, "HTTP 403"),
    ],
    ids=["unknown-cluster", "negative", "above-the-parent", "no-tenant", "a-member"],
)
def test_bad_requests_are_said_plainly_and_change_nothing(
    gantry: Any, user: str, argv: list[str], code: int, said: str
) -> None:
    answer, _, err = gantry(
        user, "quota-requests", "create", "--flavor", "H100-80GB", "--reason", "x", *argv
    )
    assert answer == code and said in err, err
    assert not ApprovalRequest.objects.exists()


def test_a_pending_request_is_withdrawn_by_its_requester(gantry: Any, org: Org) -> None:
    code, out, err = ask(gantry, "--gpus", "12", "--reason", "fewer evals")
    assert code == 0, err
    asked = json.loads(out)["id"]
    # alice, a member of team-alpha, neither asked it nor administers the team
    code, _, err = gantry("alice", "quota-requests", "withdraw", str(asked))
    assert code == 1 and ("HTTP 403" in err or "HTTP 404" in err), err
    assert ApprovalRequest.objects.get(pk=asked).state == "pending"
    code, out, err = gantry("tina", "quota-requests", "withdraw", str(asked))
    assert code == 0, err
    header, line = out.splitlines()
    assert header.split()[:2] == ["ID", "STATE"]
    assert line.split()[:2] == [str(asked), "cancelled"]
    # no longer in the approver's inbox; withdrawn twice, said plainly
    code, out, err = gantry("dana", "--json", "quota-requests", "--inbox")
    assert code == 0 and json.loads(out) == [], err
    code, _, err = gantry("tina", "quota-requests", "withdraw", str(asked))
    assert code == 1
    assert err.startswith(f"HTTP 409: Approval request {asked} was already cancelled by tina")
    code, _, err = gantry("tina", "quota-requests", "withdraw", "999999")
    assert code == 1 and "HTTP 404" in err, err
    assert Quota.objects.get(tenant=org.alpha, cluster=None).guaranteed_milli == 16000
