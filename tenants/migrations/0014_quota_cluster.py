"""Quotas pinned to a cluster (issue 38): `Quota.cluster`, nullable (null: global, as every
row so far), and uniqueness per (tenant, flavor) among the global rows and per (tenant,
flavor, cluster) among the pinned ones.

Written for an installation that runs while it applies (docs/upgrading.md, "Migrations"):
on PostgreSQL the column is added nullable, its foreign key NOT VALID then validated (every
row is null), both unique indexes are built CONCURRENTLY (hence `atomic = False`), and only
then is the old (tenant, flavor) constraint dropped. Release 1.0.0 writes global rows only,
which the partial index keeps unique exactly as the old constraint did, so nothing it does
breaks. The backstop trigger of 0005 is made to read the global rows only. On SQLite (the
embedded path, no concurrent upgrade) Django's own operations run.
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
    related_name="pinned_quotas",
    to="scheduler.cluster",
)
GLOBAL = models.UniqueConstraint(
    condition=models.Q(("cluster__isnull", True)),
    fields=("tenant", "flavor"),
    name="quota_one_global_per_flavor",
)
PINNED = models.UniqueConstraint(
    condition=models.Q(("cluster__isnull", False)),
    fields=("tenant", "flavor", "cluster"),
    name="quota_one_per_flavor_and_cluster",
)

POSTGRESQL_FORWARDS = [
    "ALTER TABLE tenants_quota ADD COLUMN cluster_id bigint NULL",
    "ALTER TABLE tenants_quota ADD CONSTRAINT tenants_quota_cluster_id_fk_scheduler_cluster_id"
    " FOREIGN KEY (cluster_id) REFERENCES scheduler_cluster (id)"
    " DEFERRABLE INITIALLY DEFERRED NOT VALID",
    "ALTER TABLE tenants_quota VALIDATE CONSTRAINT"
    " tenants_quota_cluster_id_fk_scheduler_cluster_id",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS quota_one_global_per_flavor"
    " ON tenants_quota (tenant_id, flavor_id) WHERE cluster_id IS NULL",
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS quota_one_per_flavor_and_cluster"
    " ON tenants_quota (tenant_id, flavor_id, cluster_id) WHERE cluster_id IS NOT NULL",
    "ALTER TABLE tenants_quota DROP CONSTRAINT IF EXISTS quota_one_per_flavor",
]
POSTGRESQL_BACKWARDS = [
    "ALTER TABLE tenants_quota ADD CONSTRAINT quota_one_per_flavor UNIQUE (tenant_id, flavor_id)",
    "DROP INDEX CONCURRENTLY IF EXISTS quota_one_per_flavor_and_cluster",
    "DROP INDEX CONCURRENTLY IF EXISTS quota_one_global_per_flavor",
    "ALTER TABLE tenants_quota DROP COLUMN cluster_id",
]


# The backstop trigger of 0005 (children's guarantees fit the parent's) reads the global
# quota tree only: a pinned row is checked by `tenants.quotas.rules`, and would otherwise be
# summed with its tenant's siblings as if it were a global guarantee.
TRIGGER_FUNCTION = """
CREATE OR REPLACE FUNCTION tenants_quota_children_fit() RETURNS trigger AS $$
DECLARE
    parent bigint;
    parent_guaranteed bigint;
    children bigint;
BEGIN
    IF {pinned_skip} THEN
        RETURN NULL;
    END IF;
    -- 1. this row as a child: its siblings and it fit the parent's guarantee
    SELECT t.parent_id INTO parent FROM tenants_tenant t WHERE t.id = NEW.tenant_id;
    IF parent IS NOT NULL THEN
        SELECT q.guaranteed_milli INTO parent_guaranteed FROM tenants_quota q
            WHERE q.tenant_id = parent AND q.flavor_id = NEW.flavor_id{global_only} FOR UPDATE;
        SELECT COALESCE(SUM(q.guaranteed_milli), 0) INTO children FROM tenants_quota q
            JOIN tenants_tenant t ON t.id = q.tenant_id
            WHERE t.parent_id = parent AND q.flavor_id = NEW.flavor_id{global_only};
        IF children > COALESCE(parent_guaranteed, 0) THEN
            RAISE EXCEPTION 'quota: children of tenant % guarantee % milli-GPU of flavor %, '
                'above the parent''s %', parent, children, NEW.flavor_id,
                COALESCE(parent_guaranteed, 0)
                USING ERRCODE = 'check_violation',
                      CONSTRAINT = 'quota_children_fit_parent';
        END IF;
    END IF;
    -- 2. this row as a parent: it still holds its children's guarantees
    SELECT COALESCE(SUM(q.guaranteed_milli), 0) INTO children FROM tenants_quota q
        JOIN tenants_tenant t ON t.id = q.tenant_id
        WHERE t.parent_id = NEW.tenant_id AND q.flavor_id = NEW.flavor_id{global_only};
    IF children > NEW.guaranteed_milli THEN
        RAISE EXCEPTION 'quota: tenant % guarantees % milli-GPU of flavor %, below its '
            'children''s %', NEW.tenant_id, NEW.guaranteed_milli, NEW.flavor_id, children
            USING ERRCODE = 'check_violation', CONSTRAINT = 'quota_children_fit_parent';
    END IF;
    RETURN NULL;
END;
$$ LANGUAGE plpgsql;
"""
GLOBAL_TREE = TRIGGER_FUNCTION.format(
    pinned_skip="NEW.cluster_id IS NOT NULL", global_only=" AND q.cluster_id IS NULL"
)
AS_IN_0005 = TRIGGER_FUNCTION.format(pinned_skip="FALSE", global_only="")


def global_tree_trigger(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(GLOBAL_TREE, params=None)


def trigger_as_in_0005(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(AS_IN_0005, params=None)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("scheduler", "0026_cluster_name_whole"),
        ("tenants", "0013_notification_kind_requeued"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="quota",
            options={"ordering": ["tenant_id", "flavor_id", "cluster_id"]},
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(model_name="quota", name="quota_one_per_flavor"),
                migrations.AddField(model_name="quota", name="cluster", field=FIELD),
                migrations.AddConstraint(model_name="quota", constraint=GLOBAL),
                migrations.AddConstraint(model_name="quota", constraint=PINNED),
            ],
            database_operations=[
                OnVendor(
                    "sqlite",
                    migrations.RemoveConstraint(model_name="quota", name="quota_one_per_flavor"),
                ),
                OnVendor(
                    "sqlite", migrations.AddField(model_name="quota", name="cluster", field=FIELD)
                ),
                OnVendor("sqlite", migrations.AddConstraint(model_name="quota", constraint=GLOBAL)),
                OnVendor("sqlite", migrations.AddConstraint(model_name="quota", constraint=PINNED)),
                OnVendor(
                    "postgresql",
                    migrations.RunSQL(POSTGRESQL_FORWARDS, POSTGRESQL_BACKWARDS),
                ),
            ],
        ),
        migrations.RunPython(global_tree_trigger, trigger_as_in_0005),
    ]
