"""Seed the five standard priority classes and the platform-wide job-type defaults."""

from django.db import migrations

CLASSES = [
    # name, value, may_preempt, preemptible, counts_against_quota, description
    ("critical", 1000, True, False, True, "Production-critical; never preempted."),
    ("high", 800, True, True, True, "Latency-sensitive work such as inference."),
    ("normal", 500, True, True, True, "The default for training."),
    ("low", 200, False, True, True, "Batch and evaluation; gives way first within quota."),
    ("best-effort", 0, False, True, False, "Runs only on idle capacity; preempted first."),
]
DEFAULTS = {
    "inference": "high",
    "training": "normal",
    "fine-tuning": "normal",
    "interactive": "normal",
    "batch": "low",
    "evaluation": "low",
}


def seed(apps, schema_editor):
    PriorityClass = apps.get_model("tenants", "PriorityClass")
    PriorityDefault = apps.get_model("tenants", "PriorityDefault")
    for name, value, may_preempt, preemptible, counts, description in CLASSES:
        PriorityClass.objects.get_or_create(
            name=name,
            defaults={
                "value": value, "may_preempt": may_preempt, "preemptible": preemptible,
                "counts_against_quota": counts, "description": description,
            },
        )
    for job_type, name in DEFAULTS.items():
        PriorityDefault.objects.get_or_create(
            tenant=None, job_type=job_type,
            defaults={"priority_class": PriorityClass.objects.get(name=name)},
        )


def unseed(apps, schema_editor):
    apps.get_model("tenants", "PriorityDefault").objects.filter(tenant=None).delete()


class Migration(migrations.Migration):
    dependencies = [("tenants", "0001_initial")]
    operations = [migrations.RunPython(seed, unseed)]
