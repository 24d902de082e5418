"""The cluster of each hour's devices and pinned guarantees (issue 38): `CapacityRecord.cluster`
and `GuaranteeRecord.cluster` (a cluster's name; "" on a guarantee record: the global quota),
each unique per (period, flavor, cluster) and (period, tenant, flavor, cluster).

Written for an installation that runs while it applies (docs/upgrading.md, "Migrations"):
both columns keep a `db_default` of "", so the release before, metering during the upgrade,
inserts rows without them (global guarantees, devices read as the home cluster's). The rows
metered before are the home cluster's (where the installation has one: migration
scheduler.0024 makes it), set in batches of periods. On PostgreSQL the new unique indexes
are built CONCURRENTLY (hence `atomic = False`) before the old constraints are dropped: the
old release's rows, one per (period, flavor) with "", stay unique under both. On SQLite (the
embedded path, no concurrent upgrade) Django's own operations run.
"""

from typing import Any

from django.db import migrations, models

from common.releases.operations import OnVendor

COLUMN = models.CharField(blank=True, db_default="", default="", max_length=63)
CAPACITY = models.UniqueConstraint(
    fields=("period", "flavor", "cluster"), name="capacity_record_once_per_cluster"
)
GUARANTEE = models.UniqueConstraint(
    fields=("period", "tenant", "flavor", "cluster"), name="guarantee_record_once_per_cluster"
)
POSTGRESQL_FORWARDS = [
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS capacity_record_once_per_cluster"
    " ON billing_capacityrecord (period_id, flavor, cluster)",
    "ALTER TABLE billing_capacityrecord DROP CONSTRAINT IF EXISTS capacity_record_once",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS guarantee_record_once_per_cluster"
    " ON billing_guaranteerecord (period_id, tenant_id, flavor, cluster)",
    "ALTER TABLE billing_guaranteerecord DROP CONSTRAINT IF EXISTS guarantee_record_once",
]
POSTGRESQL_BACKWARDS = [
    "ALTER TABLE billing_guaranteerecord ADD CONSTRAINT guarantee_record_once"
    " UNIQUE (period_id, tenant_id, flavor)",
    "DROP INDEX CONCURRENTLY IF EXISTS guarantee_record_once_per_cluster",
    "ALTER TABLE billing_capacityrecord ADD CONSTRAINT capacity_record_once"
    " UNIQUE (period_id, flavor)",
    "DROP INDEX CONCURRENTLY IF EXISTS capacity_record_once_per_cluster",
]
BATCH = 1000  # periods per UPDATE: a month is 720


def home_cluster(apps: Any, schema_editor: Any) -> None:
    """Capacity metered before this release is the home cluster's devices."""
    home = apps.get_model("scheduler", "Cluster").objects.filter(home=True).first()
    if home is None:
        return
    records = apps.get_model("billing", "CapacityRecord").objects.filter(cluster="")
    last = 0
    while True:
        ids = list(
            records.filter(period_id__gt=last)
            .order_by("period_id")
            .values_list("period_id", flat=True)
            .distinct()[:BATCH]
        )
        if not ids:
            return
        records.filter(period_id__in=ids).update(cluster=home.name)
        last = ids[-1]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("billing", "0018_statement_line_cluster"),
        ("scheduler", "0024_home_cluster"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="capacityrecord", options={"ordering": ["period_id", "flavor", "cluster"]}
        ),
        migrations.AlterModelOptions(
            name="guaranteerecord",
            options={"ordering": ["period_id", "tenant_id", "flavor", "cluster"]},
        ),
        migrations.AddField(model_name="capacityrecord", name="cluster", field=COLUMN),
        migrations.AddField(model_name="guaranteerecord", name="cluster", field=COLUMN),
        migrations.RunPython(home_cluster, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="capacityrecord", name="capacity_record_once"
                ),
                migrations.AddConstraint(model_name="capacityrecord", constraint=CAPACITY),
                migrations.RemoveConstraint(
                    model_name="guaranteerecord", name="guarantee_record_once"
                ),
                migrations.AddConstraint(model_name="guaranteerecord", constraint=GUARANTEE),
            ],
            database_operations=[
                OnVendor(
                    "sqlite",
                    migrations.RemoveConstraint(
                        model_name="capacityrecord", name="capacity_record_once"
                    ),
                ),
                OnVendor(
                    "sqlite",
                    migrations.AddConstraint(model_name="capacityrecord", constraint=CAPACITY),
                ),
                OnVendor(
                    "sqlite",
                    migrations.RemoveConstraint(
                        model_name="guaranteerecord", name="guarantee_record_once"
                    ),
                ),
                OnVendor(
                    "sqlite",
                    migrations.AddConstraint(model_name="guaranteerecord", constraint=GUARANTEE),
                ),
                OnVendor(
                    "postgresql", migrations.RunSQL(POSTGRESQL_FORWARDS, POSTGRESQL_BACKWARDS)
                ),
            ],
        ),
    ]
