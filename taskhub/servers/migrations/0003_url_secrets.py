import base64

import encrypted_fields.fields
from django.db import migrations

from taskhub.mcp.secret_urls import split_secrets


def secrets_out_of_stored_urls(apps, schema_editor):
    """A URL stored before: its userinfo becomes a Basic authorization header, its secret query values move to
    url_secrets (as servers.services does at every save from now on)."""
    Server = apps.get_model("servers", "Server")
    for server in Server.objects.filter(transport="http"):
        try:
            public, userinfo, secrets = split_secrets(server.url)
        except ValueError:
            continue
        if public == server.url and userinfo is None:
            continue
        if userinfo is not None and not server.bearer_token:
            basic = base64.b64encode(f"{userinfo[0]}:{userinfo[1]}".encode()).decode()
            server.headers = {**(server.headers or {}), "Authorization": f"Basic {basic}"}
        server.url, server.url_secrets = public, secrets
        server.save(update_fields=["url", "url_secrets", "headers"])


class Migration(migrations.Migration):
    dependencies = [
        ("servers", "0002_server_discovery_state"),
    ]

    operations = [
        migrations.AddField(
            model_name="server",
            name="url_secrets",
            field=encrypted_fields.fields.EncryptedJSONField(
                blank=True, default=dict, help_text="HTTP: the secret query values of the URL, by parameter (encrypted)"
            ),
        ),
        migrations.RunPython(secrets_out_of_stored_urls, migrations.RunPython.noop),
    ]
