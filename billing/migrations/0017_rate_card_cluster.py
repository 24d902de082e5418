"""Rate cards per cluster (issue 38): `RateCard.cluster`, nullable (null: the default card,
as every row so far), and a chain per (flavor, cluster): uniqueness of a start and of an open
end per flavor among the default cards, and per (flavor, cluster) among the cluster's.

Written for an installation that runs while it applies (docs/upgrading.md, "Migrations"),
as tenants 0014 is: on PostgreSQL the column is added nullable, its foreign key NOT VALID
then validated (every row is null), the four unique indexes are built CONCURRENTLY (hence
`atomic = False`), and only then are the old per-flavor constraints dropped. Release 1.0.0
writes default cards only, which the partial indexes keep unique exactly as the old
constraints did. On SQLite (the embedded path, no concurrent upgrade) Django's own operations
run. The used-version guard's trigger is installed again: a version's cluster is one of
the things it priced.
"""

from typing import Any

import django.db.models.deletion
from django.db import migrations, models

from common.releases.operations import OnVendor

FIELD = models.ForeignKey(
    blank=True,
    db_index=False,
    null=True,
    on_delete=django.db.models.deletion.PROTECT,
    related_name="rate_cards",
    to="scheduler.cluster",
)
CONSTRAINTS = [
    models.UniqueConstraint(
        condition=models.Q(("cluster__isnull", True)),
        fields=("flavor", "valid_from"),
        name="rate_card_default_one_start",
    ),
    models.UniqueConstraint(
        condition=models.Q(("cluster__isnull", False)),
        fields=("flavor", "cluster", "valid_from"),
        name="rate_card_cluster_one_start",
    ),
    models.UniqueConstraint(
        condition=models.Q(("cluster__isnull", True), ("valid_to__isnull", True)),
        fields=("flavor",),
        name="rate_card_default_one_open",
    ),
    models.UniqueConstraint(
        condition=models.Q(("cluster__isnull", False), ("valid_to__isnull", True)),
        fields=("flavor", "cluster"),
        name="rate_card_cluster_one_open",
    ),
]
OLD = ["rate_card_one_start", "rate_card_one_open"]

POSTGRESQL_FORWARDS = [
    "ALTER TABLE billing_ratecard ADD COLUMN cluster_id bigint NULL",
    "ALTER TABLE billing_ratecard ADD CONSTRAINT"
    " billing_ratecard_cluster_id_fk_scheduler_cluster_id"
    " FOREIGN KEY (cluster_id) REFERENCES scheduler_cluster (id)"
    " DEFERRABLE INITIALLY DEFERRED NOT VALID",
    "ALTER TABLE billing_ratecard VALIDATE CONSTRAINT"
    " billing_ratecard_cluster_id_fk_scheduler_cluster_id",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS rate_card_default_one_start"
    " ON billing_ratecard (flavor_id, valid_from) WHERE cluster_id IS NULL",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS rate_card_cluster_one_start"
    " ON billing_ratecard (flavor_id, cluster_id, valid_from) WHERE cluster_id IS NOT NULL",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS rate_card_default_one_open"
    " ON billing_ratecard (flavor_id) WHERE cluster_id IS NULL AND valid_to IS NULL",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS rate_card_cluster_one_open"
    " ON billing_ratecard (flavor_id, cluster_id) WHERE cluster_id IS NOT NULL"
    " AND valid_to IS NULL",
    "ALTER TABLE billing_ratecard DROP CONSTRAINT IF EXISTS rate_card_one_start",
    "DROP INDEX CONCURRENTLY IF EXISTS rate_card_one_open",
]
POSTGRESQL_BACKWARDS = [
    "ALTER TABLE billing_ratecard ADD CONSTRAINT rate_card_one_start"
    " UNIQUE (flavor_id, valid_from)",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS rate_card_one_open"
    " ON billing_ratecard (flavor_id) WHERE valid_to IS NULL",
    "DROP INDEX CONCURRENTLY IF EXISTS rate_card_cluster_one_open",
    "DROP INDEX CONCURRENTLY IF EXISTS rate_card_default_one_open",
    "DROP INDEX CONCURRENTLY IF EXISTS rate_card_cluster_one_start",
    "DROP INDEX CONCURRENTLY IF EXISTS rate_card_default_one_start",
    "ALTER TABLE billing_ratecard DROP COLUMN cluster_id",
]


def drop_sqlite_triggers(apps: object, schema_editor: Any) -> None:
    """SQLite: the used-version triggers go before Django remakes billing_ratecard (the
    multipliers' name it, and a trigger naming a table that is gone fails the rename)."""
    from billing.statements.guards import SQLITE_RATES

    if schema_editor.connection.vendor == "sqlite":
        for name in SQLITE_RATES:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


def install_triggers(apps: object, schema_editor: Any) -> None:
    """The used-version guard now counts the cluster among the prices a version fixed
    (billing/statements/guards.py): PostgreSQL's function is replaced, SQLite's triggers
    made again."""
    from billing.statements.guards import ensure_triggers

    drop_sqlite_triggers(apps, schema_editor)
    ensure_triggers(schema_editor.connection)


def _state() -> list[migrations.operations.base.Operation]:
    return [
        *(migrations.RemoveConstraint(model_name="ratecard", name=name) for name in OLD),
        migrations.AddField(model_name="ratecard", name="cluster", field=FIELD),
        *(migrations.AddConstraint(model_name="ratecard", constraint=c) for c in CONSTRAINTS),
    ]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("billing", "0016_usage_record_cluster"),
        ("scheduler", "0026_cluster_name_whole"),
        ("tenants", "0014_quota_cluster"),
    ]

    operations = [
        migrations.RunPython(drop_sqlite_triggers, install_triggers),
        migrations.AlterModelOptions(
            name="ratecard",
            options={"ordering": ["flavor_id", "cluster_id", "valid_from"]},
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=_state(),
            database_operations=[
                *(OnVendor("sqlite", op) for op in _state()),
                OnVendor(
                    "postgresql", migrations.RunSQL(POSTGRESQL_FORWARDS, POSTGRESQL_BACKWARDS)
                ),
            ],
        ),
        migrations.RunPython(install_triggers, drop_sqlite_triggers),
    ]
