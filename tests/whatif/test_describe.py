"""A what-if's changes in words, as the what-if pages list them: each figure with its own unit
(a weight labelled "weight 50000.0 GPUs" was the defect)."""

from __future__ import annotations

from typing import Any

import pytest

from whatif.models import WhatIf

QUOTA = {"kind": "quota", "tenant": "team-bravo", "flavor": "H100-80GB"}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        pytest.param({**QUOTA, "weight": 2.0}, "team-bravo, H100-80GB: weight 2", id="weight"),
        pytest.param(
            {**QUOTA, "weight": 0.25}, "team-bravo, H100-80GB: weight 0.25", id="weight-2"
        ),
        pytest.param(
            # milli-GPU as GPUs: 16000 -> 16, 2500 -> 2.5
            {**QUOTA, "cluster": "site-b", "guaranteed_milli": 2500, "limit_milli": 16000},
            "team-bravo, H100-80GB on site-b: guaranteed 2.5 GPUs, limit 16 GPUs",
            id="pinned",
        ),
        pytest.param(
            {
                **QUOTA,
                "guaranteed_milli": 16000,
                "limit_milli": 24000,
                "lend_limit_milli": 8000,
                "user_limit_milli": 4000,
                "weight": 3,
            },
            "team-bravo, H100-80GB: guaranteed 16 GPUs, limit 24 GPUs, lends at most 8 GPUs, "
            "one user at most 4 GPUs, weight 3",
            id="every-field",
        ),
        pytest.param(
            # null sets "none", unlike a field left out (today's value kept)
            {**QUOTA, "lend_limit_milli": None, "user_limit_milli": None},
            "team-bravo, H100-80GB: lends all its guarantee, no cap per user",
            id="cleared",
        ),
        pytest.param(
            {"kind": "inventory", "action": "add", "flavor": "H100-80GB", "gpus": 16},
            "add 16 GPUs of H100-80GB",
            id="inventory-add",
        ),
        pytest.param(
            {
                "kind": "inventory",
                "action": "move",
                "flavor": "H100-80GB",
                "gpus": 8,
                "from_pool": "spot",
                "to_pool": "train",
            },
            "move 8 GPUs of H100-80GB from pool spot to pool train",
            id="inventory-move",
        ),
        pytest.param(
            {"kind": "demand", "flavor": "H100-80GB", "scale": 1.5, "at_day": 30},
            "H100-80GB's demand forecast 30 days ahead: the window's jobs \u00d71.5",
            id="demand",
        ),
        pytest.param(
            {"kind": "priority_class", "name": "normal", "value": 7},
            "priority class normal: value 7",
            id="priority-class",
        ),
    ],
)
def test_each_change_is_described_with_its_own_unit(change: dict[str, Any], words: str) -> None:
    assert WhatIf(changes=[change]).changes_described == [words]
