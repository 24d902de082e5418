"""The daemon does not lead on a schema it cannot run on (docs/upgrading.md,
common/releases/schema.py).

`SchemaGuardedLease` is the lease `run_scheduler` leads with: before taking the lease, and
each time it renews it, it checks the database's applied migrations. When a contract step
this code does not know is applied (a later release took away what this one may use), it
does not take the lease, or steps down at the next renewal, and says why in the log once per
distinct finding; a daemon of the release that made the migration leads instead. A schema
merely newer (expanded by the next release) is run on: that is the upgrade's roll.
"""

from __future__ import annotations

import logging
from typing import Any

from common.releases.schema import SchemaStatus, schema_status
from scheduler.leader import Lease

log = logging.getLogger("gantry.daemon")


class SchemaGuardedLease(Lease):
    refused: SchemaStatus | None = None  # the finding last logged, None while compatible

    def acquire(self) -> bool:
        return self._compatible() and super().acquire()

    def renew(self, state: dict[str, Any] | None = None) -> bool:
        if not self._compatible():
            self.release()
            return False
        return super().renew(state)

    def _compatible(self) -> bool:
        status = schema_status()
        if status.state != "incompatible":
            self.refused = None
            return True
        if status != self.refused:
            log.error("refusing to lead: %s", status.describe())
            self.refused = status
        return False
