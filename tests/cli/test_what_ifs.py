"""`gantry whatif` against a live server (issue 38): the runs an admin may see, one run's
progress and its results side by side, a new run from a proposal file; bad proposals and
those who may not replay are said plainly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Org
from tests.whatif.builders import kept_run
from whatif.models import WhatIf

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_admin_lists_runs_and_reads_one_side_by_side(gantry: Any, org: Org) -> None:
    run = kept_run(org.users["dana"], org.research, ["team-alpha", "team-bravo"])
    code, out, err = gantry("dana", "whatif")
    assert code == 0, err
    header, line = out.splitlines()
    assert header.split()[:4] == ["ID", "STATE", "PROGRESS", "SCOPE"]
    assert line.split()[:5] == [str(run.pk), "done", "100%", "research", "dana"]
    assert "research, H100-80GB: weight 2" in line
    code, out, err = gantry("dana", "whatif", "show", str(run.pk))
    assert code == 0, err
    assert "baseline: utilization 50.0%, fairness 1.00" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("team-")]
    # a row per tenant and side: 1 job, started, waited 60 s, 1 GPU-hour
    assert rows[:2] == [
        ["team-alpha", "baseline", "1", "1", "0", "60", "s", "60", "s", "1", "0", "0"],
        ["team-alpha", "proposed", "1", "1", "0", "60", "s", "60", "s", "1", "0", "0"],
    ]
    code, out, _ = gantry("dana", "--json", "whatif", "show", str(run.pk))
    assert json.loads(out)["results"]["jobs_replayed"] == 1


def test_a_run_starts_from_a_proposal_file(gantry: Any, org: Org, tmp_path: Path) -> None:
    proposal = tmp_path / "proposal.yaml"
    proposal.write_text(
        "window_days: 3\n"
        "changes:\n"
        "  - {kind: quota, tenant: team-bravo, flavor: H100-80GB,"
        " guaranteed_milli: 8000, limit_milli: 16000}\n"
    )
    code, out, err = gantry("dana", "--json", "whatif", "run", str(proposal), "--scope", "research")
    assert code == 0, err
    made = json.loads(out)
    assert (made["scope"], made["window_days"], made["state"]) == ("research", 3, "queued")
    assert made["changes"][0]["tenant"] == "team-bravo"
    assert WhatIf.objects.get().requested_by == org.users["dana"]


@pytest.mark.parametrize(
    ("user", "text", "code", "said"),
    [
        ("dana", "kind: quota\n", 2, "must be a list of changes, or a mapping with `changes:`"),
        ("dana", "- {kind: quota, tenant: nobody, flavor: H100-80GB, weight: 2}\n", 1, "nobody"),
        ("alice", "- {kind: quota, tenant: team-alpha, flavor: H100-80GB, weight: 2}\n", 1, "404"),
    ],
    ids=["not-a-proposal", "unknown-tenant", "a-member"],
)
def test_bad_proposals_are_said_plainly_and_start_nothing(
    gantry: Any, tmp_path: Path, user: str, text: str, code: int, said: str
) -> None:
    proposal = tmp_path / "proposal.yaml"
    proposal.write_text(text)
    scope = "team-alpha" if user == "alice" else "research"  # alice's team, which she sees
    answer, _, err = gantry(user, "whatif", "run", str(proposal), "--scope", scope)
    assert answer == code and said in err, err
    assert not WhatIf.objects.exists()
