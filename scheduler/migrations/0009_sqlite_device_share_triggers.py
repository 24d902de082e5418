"""SQLite: reinstall the device-share triggers that 0008's table rebuild dropped, and recount
the devices (see scheduler/nodes/triggers.py). Nothing to do on PostgreSQL."""

from django.db import migrations


def reinstall(apps, schema_editor):
    from scheduler.nodes.triggers import ensure_sqlite_triggers

    ensure_sqlite_triggers(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("scheduler", "0008_fewer_indexes")]

    operations = [migrations.RunPython(reinstall, migrations.RunPython.noop)]
