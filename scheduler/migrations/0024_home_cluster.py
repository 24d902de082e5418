"""The home cluster: the backend `run_scheduler` drives (GANTRY_CLUSTER_BACKEND), named
GANTRY_CLUSTER_NAME; every node found is its node. Nodes keep their names. In batches: the
daemon of the release before keeps syncing nodes while this runs (docs/upgrading.md), and a
node it inserts later, without a cluster, is the home cluster's too (`Node.cluster` None)."""

from django.conf import settings
from django.db import migrations

BATCH = 1000


def home_cluster(apps, schema_editor):
    Cluster = apps.get_model("scheduler", "Cluster")
    Node = apps.get_model("scheduler", "Node")
    backend = settings.GANTRY_CLUSTER_BACKEND
    home, _ = Cluster.objects.get_or_create(
        home=True,
        defaults={
            "name": settings.GANTRY_CLUSTER_NAME,
            "backend": backend if backend in ("simulated", "kubernetes") else "simulated",
        },
    )
    while True:
        ids = list(Node.objects.filter(cluster__isnull=True).values_list("id", flat=True)[:BATCH])
        if not ids:
            return
        Node.objects.filter(id__in=ids).update(cluster=home)


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0023_cluster")]

    operations = [migrations.RunPython(home_cluster, migrations.RunPython.noop)]
