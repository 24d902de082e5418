"""Whether this code and the database's schema may run together (docs/upgrading.md).

An upgrade migrates the database while the previous release still runs (expand), then rolls
the web and the daemon; a migration that takes away what the previous release uses ships a
release later (contract), named `<number>_<what>_contract` so that code which has never seen
its file still recognises it in `django_migrations`. The states:

- "ok": every migration applied is one this code has, and every one it has is applied;
- "newer": the database has migrations this code does not know, none of them a contract step:
  a later release expanded the schema, which this code runs on (the roll in progress);
- "behind": migrations of this code are not applied yet (`manage.py migrate` first);
- "incompatible": a contract step this code does not know is applied: this code may read or
  write what is gone. The daemon refuses to lead (scheduler/daemon/schema_guard.py) and
  /healthz is degraded.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from django.db import connections
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder

CONTRACT_SUFFIX = "_contract"

Key = tuple[str, str]  # (app label, migration name)


@dataclass(frozen=True)
class SchemaStatus:
    state: str  # "ok", "newer", "behind", "incompatible"
    unknown: tuple[Key, ...] = ()  # applied, not in this code
    missing: tuple[Key, ...] = ()  # in this code, not applied
    contract: tuple[Key, ...] = ()  # the unknown ones that are contract steps

    def describe(self) -> str:
        names = ", ".join(f"{app}.{name}" for app, name in self.contract)
        return (
            f"the database has the contract migration(s) {names} applied, which this release "
            "does not know: it may use what they took away. Upgrade this process to the "
            "release that made them (docs/upgrading.md)."
        )


@cache
def known_migrations() -> frozenset[Key]:
    """Every migration this code has on disk (read once per process: the code does not
    change under a running process)."""
    return frozenset(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)


def is_contract(key: Key) -> bool:
    return key[1].endswith(CONTRACT_SUFFIX)


def schema_status(alias: str = "default") -> SchemaStatus:
    """This code against the database `alias` (one query: the applied migrations)."""
    applied = set(MigrationRecorder(connections[alias]).applied_migrations())
    known = known_migrations()
    unknown = tuple(sorted(applied - known))
    missing = tuple(sorted(known - applied))
    contract = tuple(key for key in unknown if is_contract(key))
    if contract:
        state = "incompatible"
    elif missing:
        state = "behind"
    elif unknown:
        state = "newer"
    else:
        state = "ok"
    return SchemaStatus(state, unknown, missing, contract)
