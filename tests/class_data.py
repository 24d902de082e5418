"""Rows built once for a class of tests, as Django's `TestCase.setUpTestData` builds them.

A class-scoped fixture builds its rows inside a transaction that stays open while the class's
tests run; each test's own transaction (pytest-django's `db`) is then a savepoint inside it,
rolled back after the test, so every test starts from the rows as built. The transaction is
rolled back after the class's last test. Each test gets a deep copy of the built objects, as
`setUpTestData` hands them out: a test that changes one in memory leaves the next test's alone.

Only for tests that run in one transaction (`db`, never `transactional_db` or `live_server`):
their writes must stay uncommitted, and no other connection may need to see the rows. A
module-scoped fixture holds its rows while any test of the module runs: only where every
database test of the module asks for them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.db import transaction
from django.test.utils import override_settings

T = TypeVar("T")

# The suite's hasher (tests/conftest.py's `_fast_password_hashing` is function-scoped and
# not yet in force when a class-scoped fixture runs): the same hashes as a test's own build.
FAST_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def built_for_the_class(django_db_blocker: Any, build: Callable[[], T]) -> Iterator[T]:
    """Yield what `build()` returned, its rows held in an open transaction until the end.

    Call from a class- (or module-) scoped fixture that depends on `django_db_setup` and
    `django_db_blocker` (pytest-django's): `yield from built_for_the_class(django_db_blocker,
    build)`."""
    from tests.conftest import fresh_cache

    with django_db_blocker.unblock():
        atomic = transaction.atomic()
        atomic.__enter__()
        try:
            # As a test's own build starts: no counters or memos left by the test before.
            fresh_cache()
            with override_settings(PASSWORD_HASHERS=FAST_HASHERS):
                built = build()
        except BaseException:
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)
            raise
    try:
        yield built
    finally:
        with django_db_blocker.unblock():
            transaction.set_rollback(True)
            atomic.__exit__(None, None, None)


def copied(built: T) -> T:
    """What a test gets of the class's objects: its own copy (`setUpTestData`'s rule)."""
    return copy.deepcopy(built)
