"""Every test here starts with the home cluster the migration makes (a transactional test
elsewhere in the run flushes the tables, migrated rows included)."""

from __future__ import annotations

from typing import Any

import pytest

from scheduler.models import Cluster


@pytest.fixture(autouse=True)
def home_cluster(request: Any) -> None:
    if "db" in request.fixturenames or request.node.get_closest_marker("django_db"):
        request.getfixturevalue("db")
        Cluster.objects.get_or_create(home=True, defaults={"name": "local", "backend": "simulated"})
