from datetime import timedelta

from django.db import migrations, models

MICROSECOND = timedelta(microseconds=1)


def fill_micros(apps, schema_editor):
    """The records metered before the column: end - start in microseconds."""
    usage = apps.get_model("billing", "UsageRecord")
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            'UPDATE billing_usagerecord SET micros = (EXTRACT(EPOCH FROM ("end" - "start"))'
            " * 1000000)::bigint"
        )
        return
    batch = []
    for record in usage.objects.only("id", "start", "end").iterator(chunk_size=2000):
        record.micros = (record.end - record.start) // MICROSECOND
        batch.append(record)
        if len(batch) == 2000:
            usage.objects.bulk_update(batch, ["micros"])
            batch = []
    usage.objects.bulk_update(batch, ["micros"])


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0008_statement_line_split"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagerecord",
            name="micros",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(fill_micros, migrations.RunPython.noop),
    ]
