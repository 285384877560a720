from django.db import migrations

# Written out here rather than imported, so this migration means the same whatever the code becomes.
AGENTS = "agents"


def create_agents_group(apps, schema_editor):
    group_model = apps.get_model("auth", "Group")
    group_model.objects.using(schema_editor.connection.alias).get_or_create(name=AGENTS)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_cache_table")]

    # Reversing keeps the group: deleting it would silently drop every membership.
    operations = [migrations.RunPython(create_agents_group, migrations.RunPython.noop)]
