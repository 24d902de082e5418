"""A global and a pinned quota request for one flavor may both be pending (issue 38):
`ApprovalRequest.subject_cluster` (the cluster's id of a pinned quota request, 0 otherwise),
and one pending request per (kind, tenant, subject, cluster) instead of per (kind, tenant,
subject).

Written for an installation that runs while it applies (docs/upgrading.md, "Migrations"): the
column keeps a `db_default` of 0, so the release before, which opens global quota requests
and job requests only, inserts rows without it. The pending pinned quota requests (few: one
per tenant and flavor at most) get their cluster from their payload. On PostgreSQL the new
partial unique index is built CONCURRENTLY (hence `atomic = False`) before the old constraint
is dropped: every row the old rule kept unique is unique under the new one. On SQLite (the
embedded path, no concurrent upgrade) Django's own operations run.
"""

from typing import Any

from django.db import migrations, models

from common.releases.operations import OnVendor

PENDING = models.UniqueConstraint(
    condition=models.Q(("state", "pending")),
    fields=("kind", "tenant", "subject_id", "subject_cluster"),
    name="approval_one_pending_per_subject_and_cluster",
)
POSTGRESQL_FORWARDS = [
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS approval_one_pending_per_subject_and_cluster"
    " ON tenants_approvalrequest (kind, tenant_id, subject_id, subject_cluster)"
    " WHERE state = 'pending'",
    "DROP INDEX CONCURRENTLY IF EXISTS approval_one_pending_per_subject",
]
POSTGRESQL_BACKWARDS = [
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS approval_one_pending_per_subject"
    " ON tenants_approvalrequest (kind, tenant_id, subject_id) WHERE state = 'pending'",
    "DROP INDEX CONCURRENTLY IF EXISTS approval_one_pending_per_subject_and_cluster",
]


def pinned_from_payload(apps: Any, schema_editor: Any) -> None:
    requests = apps.get_model("tenants", "ApprovalRequest").objects.filter(
        kind="quota", state="pending", payload__cluster__isnull=False
    )
    for request in requests.only("payload"):
        cluster = request.payload.get("cluster")
        if cluster:
            request.subject_cluster = cluster
            request.save(update_fields=["subject_cluster"])


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("tenants", "0014_quota_cluster")]

    operations = [
        migrations.AddField(
            model_name="approvalrequest",
            name="subject_cluster",
            field=models.PositiveBigIntegerField(db_default=0, default=0),
        ),
        migrations.RunPython(pinned_from_payload, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="approvalrequest", name="approval_one_pending_per_subject"
                ),
                migrations.AddConstraint(model_name="approvalrequest", constraint=PENDING),
            ],
            database_operations=[
                OnVendor(
                    "sqlite",
                    migrations.RemoveConstraint(
                        model_name="approvalrequest", name="approval_one_pending_per_subject"
                    ),
                ),
                OnVendor(
                    "sqlite",
                    migrations.AddConstraint(model_name="approvalrequest", constraint=PENDING),
                ),
                OnVendor(
                    "postgresql", migrations.RunSQL(POSTGRESQL_FORWARDS, POSTGRESQL_BACKWARDS)
                ),
            ],
        ),
    ]
