"""The books' rows (billing/models/books.py): statement seals (every statement closed so far is
sealed), metering's mark on allocations, proposed adjustments and usage checks; and the
triggers: only adjustments into a sealed statement, used rate card versions immutable
(billing/statements/guards.py)."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def seal_and_install(apps, schema_editor):
    from billing.statements.guards import ensure_triggers

    Statement = apps.get_model("billing", "Statement")
    StatementSeal = apps.get_model("billing", "StatementSeal")
    StatementSeal.objects.bulk_create(
        StatementSeal(statement_id=pk, sealed_at=closed_at)
        for pk, closed_at in Statement.objects.values_list("pk", "closed_at")
    )
    ensure_triggers(schema_editor.connection)


def remove(apps, schema_editor):
    from billing.statements.guards import SQLITE_RATES, SQLITE_SEALED

    connection = schema_editor.connection
    if connection.vendor == "postgresql":
        for trigger, table in (
            ("billing_statementline_sealed", "billing_statementline"),
            ("billing_ratecard_used", "billing_ratecard"),
            ("billing_ratemultiplier_used", "billing_ratemultiplier"),
        ):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {trigger} ON {table}")
    elif connection.vendor == "sqlite":
        for name in [*SQLITE_SEALED, *SQLITE_RATES]:
            schema_editor.execute(f"DROP TRIGGER IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0013_budget_set_from"),
        ("scheduler", "0022_xid_event_count"),
        ("tenants", "0010_rules_set_from"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="MeteringMark",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("allocation_id", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.CreateModel(
            name="StatementSeal",
            fields=[
                (
                    "statement",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.PROTECT,
                        primary_key=True,
                        related_name="seal",
                        serialize=False,
                        to="billing.statement",
                    ),
                ),
                ("sealed_at", models.DateTimeField()),
            ],
        ),
        migrations.CreateModel(
            name="UsageCheck",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("checked_at", models.DateTimeField()),
                ("start", models.DateTimeField()),
                ("end", models.DateTimeField()),
                ("gaps", models.PositiveIntegerField(default=0)),
                ("allocations", models.JSONField(blank=True, default=list)),
            ],
            options={
                "ordering": ["-checked_at", "-id"],
            },
        ),
        migrations.CreateModel(
            name="AdjustmentProposal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("amount", models.DecimalField(decimal_places=2, max_digits=16)),
                ("reason", models.CharField(max_length=500)),
                (
                    "state",
                    models.CharField(
                        choices=[("pending", "Pending"), ("accepted", "Accepted")],
                        default="pending",
                        max_length=16,
                    ),
                ),
                ("created_at", models.DateTimeField()),
                (
                    "allocation",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="scheduler.allocation",
                    ),
                ),
                (
                    "decided_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "line",
                    models.OneToOneField(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="billing.statementline",
                    ),
                ),
                (
                    "project",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="tenants.project",
                    ),
                ),
                (
                    "statement",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="proposals",
                        to="billing.statement",
                    ),
                ),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "ordering": ["-created_at", "-id"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("statement", "allocation"), name="adjustment_proposal_once"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("state", "pending"), ("line__isnull", False), _connector="OR"
                        ),
                        name="adjustment_proposal_accepted_has_line",
                    ),
                ],
            },
        ),
        migrations.RunPython(seal_and_install, remove),
    ]
