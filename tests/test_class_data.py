"""tests/class_data.py: rows built once for a class, each test starting from them as built.

Both tests of the class do the same: find the built rows and objects as built, then change
them; whichever runs second fails if the first one's changes outlived it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from tenants.models import Tenant, TenantKind
from tests import factories as f
from tests.class_data import built_for_the_class, copied

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="class")
def built_once(django_db_setup: None, django_db_blocker: Any) -> Iterator[dict[str, Any]]:
    def build() -> dict[str, Any]:
        return {
            "tenant": f.TenantFactory(slug="built", kind=TenantKind.ORGANISATION),
            "user": f.UserFactory(username="built-user"),
        }

    yield from built_for_the_class(django_db_blocker, build)


class TestBuiltOnce:
    @pytest.fixture
    def built(self, built_once: dict[str, Any], db: None) -> dict[str, Any]:
        return copied(built_once)

    @pytest.mark.parametrize("turn", [1, 2])
    def test_each_test_starts_from_the_rows_as_built(self, turn: int, built: Any) -> None:
        assert list(Tenant.objects.values_list("slug", flat=True)) == ["built"]
        assert built["tenant"].name == Tenant.objects.get().name
        f.TenantFactory(slug=f"written-{turn}", kind=TenantKind.ORGANISATION)
        built["tenant"].name = f"changed in memory {turn}"
        Tenant.objects.filter(slug="built").update(name=f"changed {turn}")

    def test_the_users_password_is_hashed_as_a_tests_own_would_be(self, built: Any) -> None:
        user = User.objects.get(username="built-user")
        assert user.password.startswith("md5$")
        assert user.check_password("correct-horse-battery")
        assert connection.in_atomic_block


def test_after_the_class_its_rows_are_gone() -> None:
    assert not Tenant.objects.filter(slug="built").exists()
    assert not User.objects.filter(username="built-user").exists()
