from django.db import migrations

from taskhub.mcp.secret_urls import split_secrets


def secrets_named_by_the_rule_out_of_stored_urls(apps, schema_editor):
    """Query values that the broader rule of secret names (any name containing key, token, secret, sig, pass, auth
    or credential) now calls secret, such as access_key or subscription-key, move from stored URLs to url_secrets."""
    Server = apps.get_model("servers", "Server")
    for server in Server.objects.filter(transport="http"):
        try:
            public, _, found = split_secrets(server.url)
        except ValueError:
            continue
        if public != server.url:
            server.url = public
            server.url_secrets = {**(server.url_secrets or {}), **found}
            server.save(update_fields=["url", "url_secrets"])


class Migration(migrations.Migration):
    dependencies = [
        ("servers", "0008_remove_server_approver_groups"),
    ]

    operations = [
        migrations.RunPython(secrets_named_by_the_rule_out_of_stored_urls, migrations.RunPython.noop),
    ]
