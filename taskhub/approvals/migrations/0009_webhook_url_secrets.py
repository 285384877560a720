import encrypted_fields.fields
from django.db import migrations

from taskhub.mcp.secret_urls import split_secrets


def secrets_out_of_stored_urls(apps, schema_editor):
    """A webhook URL stored before: its secret query values move to url_secrets (as approvals.webhooks does at every
    save from now on)."""
    PolicyWebhook = apps.get_model("approvals", "PolicyWebhook")
    for webhook in PolicyWebhook.objects.all():
        try:
            public, _, secrets = split_secrets(webhook.url)
        except ValueError:
            continue
        if public != webhook.url:
            webhook.url, webhook.url_secrets = public, secrets
            webhook.save(update_fields=["url", "url_secrets"])


class Migration(migrations.Migration):
    dependencies = [
        ("approvals", "0008_mail_event_gave_up"),
    ]

    operations = [
        migrations.AddField(
            model_name="policywebhook",
            name="url_secrets",
            field=encrypted_fields.fields.EncryptedJSONField(blank=True, default=dict),
        ),
        migrations.RunPython(secrets_out_of_stored_urls, migrations.RunPython.noop),
    ]
