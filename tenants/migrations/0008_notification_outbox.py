import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tenants", "0007_cost_rule_webhook"),
    ]

    operations = [
        migrations.CreateModel(
            name="Notification",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "kind",
                    models.CharField(
                        choices=[
                            ("approval_needed", "Approval Needed"),
                            ("started", "Started"),
                            ("finished", "Finished"),
                            ("failed", "Failed"),
                            ("preempted", "Preempted"),
                            ("idle", "Idle"),
                            ("budget_alert", "Budget Alert"),
                            ("test", "Test"),
                        ],
                        max_length=16,
                    ),
                ),
                (
                    "channel",
                    models.CharField(
                        choices=[("webhook", "Webhook"), ("email", "Email")], max_length=8
                    ),
                ),
                ("recipient", models.CharField(blank=True, default="", max_length=254)),
                ("subject", models.CharField(blank=True, default="", max_length=200)),
                ("payload", models.JSONField()),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("pending", "Pending"),
                            ("sent", "Sent"),
                            ("failed", "Failed"),
                            ("dropped", "Dropped"),
                        ],
                        default="pending",
                        max_length=8,
                    ),
                ),
                ("attempts", models.PositiveSmallIntegerField(default=0)),
                ("next_attempt_at", models.DateTimeField()),
                ("last_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("last_error", models.CharField(blank=True, default="", max_length=500)),
                ("last_error_at", models.DateTimeField(blank=True, null=True)),
                ("created_at", models.DateTimeField()),
                ("sent_at", models.DateTimeField(blank=True, null=True)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="notifications",
                        to="tenants.tenant",
                    ),
                ),
            ],
            options={
                "ordering": ["id"],
                "indexes": [
                    models.Index(
                        condition=models.Q(("state", "pending")),
                        fields=["next_attempt_at"],
                        name="notification_due",
                    ),
                    models.Index(
                        fields=["tenant", "channel", "state"], name="notification_tenant_state"
                    ),
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(
                            models.Q(("channel", "email"), _negated=True),
                            models.Q(("recipient", ""), _negated=True),
                            _connector="OR",
                        ),
                        name="notification_email_to",
                    )
                ],
            },
        ),
    ]
