"""The database itself refuses a cluster name that is not a whole DNS label: `\\Z`, not `$`,
which Python's regex (SQLite's REGEXP) lets end before a trailing newline."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from scheduler.models import Cluster


@pytest.mark.parametrize("name", ["east\n", "East", "-east"])
def test_a_name_that_is_not_a_dns_label_is_refused_by_the_database(db: Any, name: str) -> None:
    with pytest.raises(IntegrityError), transaction.atomic():
        Cluster.objects.create(name=name, backend="simulated")
    assert not Cluster.objects.filter(name=name).exists()


def test_a_dns_label_is_taken(db: Any) -> None:
    Cluster.objects.create(name="east-1", backend="simulated")
    assert Cluster.objects.filter(name="east-1").exists()
