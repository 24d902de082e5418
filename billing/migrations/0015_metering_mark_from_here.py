"""Metering's high-water mark starts at the allocations already there (billing/metering/late.py):
an installation's history was metered by hour before the mark existed, and its first run
would otherwise read every allocation ever written. Anything of that history left unmetered
is what the reconciliation of allocations against usage records reports."""

from django.db import migrations
from django.db.models import Max


def start_here(apps, schema_editor):
    MeteringMark = apps.get_model("billing", "MeteringMark")
    Allocation = apps.get_model("scheduler", "Allocation")
    if not MeteringMark.objects.exists():
        top = Allocation.objects.aggregate(top=Max("id"))["top"] or 0
        MeteringMark.objects.create(allocation_id=top)


class Migration(migrations.Migration):
    dependencies = [("billing", "0014_books_seals_marks_proposals")]

    operations = [migrations.RunPython(start_here, migrations.RunPython.noop)]
