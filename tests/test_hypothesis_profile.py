"""The suite's Hypothesis profile (tests/conftest.py): no timing judged in a test."""

from __future__ import annotations

from hypothesis import HealthCheck, settings


def test_the_profile_judges_no_time() -> None:
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check
