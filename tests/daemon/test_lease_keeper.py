"""The lease is kept through the whole cycle: every phase that writes renews it first once a
third of the TTL has passed, the phases after the binds included."""

from __future__ import annotations

from typing import Any

import pytest

import scheduler.daemon.loop as loop
from tests.daemon.conftest import Env


class Monotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("slow", ["write_starts", "write_reasons"])
def test_a_slow_phase_after_the_binds_does_not_let_the_lease_lapse(
    env: Env, monkeypatch: pytest.MonkeyPatch, slow: str
) -> None:
    """A phase after the commit that takes more than a third of the TTL is followed by a
    renewal before the next phase writes (the phases after the binds used to write on the
    renewal made before the bind)."""
    daemon = env.daemon()
    env.run(daemon)  # leading
    monotonic = Monotonic()
    daemon.keeper.monotonic = monotonic
    daemon.keeper.mark_renewed()
    renewals: list[str] = []
    renew = daemon.lease.renew

    def counted(*args: Any, **kwargs: Any) -> bool:
        renewals.append("renew")
        return renew(*args, **kwargs)

    monkeypatch.setattr(daemon.lease, "renew", counted)
    real = getattr(loop, slow)
    order: list[str] = []

    def slow_phase(*args: Any, **kwargs: Any) -> Any:
        order.append(slow)
        monotonic.now += daemon.lease.ttl_s / 3 + 1  # this phase took longer than that
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, slow, slow_phase)
    renewals_at_slow = 0

    def statistics(now: float) -> list[str]:
        order.append("statistics")
        nonlocal renewals_at_slow
        renewals_at_slow = len(renewals)
        return []

    monkeypatch.setattr(daemon.statistics, "refresh", statistics)
    env.submit(simulation={"duration_s": 600})
    daemon.step()
    assert order == [slow, "statistics"]
    assert renewals_at_slow >= 1  # renewed after the slow phase, before the next one
    assert daemon.lease.leading
