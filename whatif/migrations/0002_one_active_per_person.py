from django.conf import settings
from django.db import migrations, models


def keep_newest_active(apps, schema_editor):
    """Before the constraint: of a person's runs still queued or running, all but the newest
    are failed (started before the allowance, they would block it)."""
    WhatIf = apps.get_model("whatif", "WhatIf")
    active = WhatIf.objects.filter(state__in=["queued", "running"]).order_by("-created_at", "-id")
    seen = set()
    for run in active:
        if run.requested_by_id in seen:
            run.state = "failed"
            run.error = "stopped: one run at a time per person; start it again."
            run.save(update_fields=["state", "error"])
        seen.add(run.requested_by_id)


class Migration(migrations.Migration):

    dependencies = [
        ("whatif", "0001_initial"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(keep_newest_active, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="whatif",
            constraint=models.UniqueConstraint(
                condition=models.Q(("state__in", ["queued", "running"])),
                fields=("requested_by",),
                name="whatif_one_active_per_person",
            ),
        ),
    ]
