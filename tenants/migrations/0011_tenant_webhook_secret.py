import secrets

from django.db import migrations, models


def give_secrets(apps, schema_editor):
    """Every webhook already set gets a secret, so that every post is signed; its admins see
    it by rotating it (POST /api/v1/tenants/{id}/webhook/secret/)."""
    Tenant = apps.get_model("tenants", "Tenant")
    for tenant in Tenant.objects.exclude(webhook_url="").filter(webhook_secret=""):
        tenant.webhook_secret = "whsec_" + secrets.token_urlsafe(32)
        tenant.save(update_fields=["webhook_secret"])


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0010_rules_set_from"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="webhook_secret",
            field=models.CharField(blank=True, default="", editable=False, max_length=100),
        ),
        migrations.RunPython(give_secrets, migrations.RunPython.noop),
    ]
