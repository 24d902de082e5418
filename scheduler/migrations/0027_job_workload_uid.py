"""An index of the jobs of objects created in Kubernetes by the object's uid (issue 37): the
workload controller finds an object's job by it at every pass (scheduler/workloads/mirror.py),
which scanned every job ever submitted per object.

Written for an installation that runs while it applies (docs/upgrading.md, "Migrations"): on
PostgreSQL the index is built CONCURRENTLY (hence `atomic = False`), the jobs table written
meanwhile; on SQLite (the embedded path, no concurrent upgrade) Django's own operation runs.
"""

from django.db import migrations, models
from django.db.models.fields.json import KeyTransform

from common.releases.operations import OnVendor

INDEX = models.Index(KeyTransform("uid", KeyTransform("workload", "spec")), name="job_workload_uid")
# The expression Django writes for `spec__workload__uid` lookups, so that they use the index.
POSTGRESQL_FORWARDS = (
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_workload_uid"
    " ON scheduler_job ((spec #> '{workload,uid}'))"
)
POSTGRESQL_BACKWARDS = "DROP INDEX CONCURRENTLY IF EXISTS job_workload_uid"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("scheduler", "0026_cluster_name_whole")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.AddIndex(model_name="job", index=INDEX)],
            database_operations=[
                OnVendor("sqlite", migrations.AddIndex(model_name="job", index=INDEX)),
                OnVendor(
                    "postgresql",
                    migrations.RunSQL(POSTGRESQL_FORWARDS, POSTGRESQL_BACKWARDS),
                ),
            ],
        )
    ]
