from django.db import migrations

# Written out here rather than imported, so this migration means the same whatever the code becomes.
ROLE_GROUPS = ("approvers", "operators", "admins")


def create_role_groups(apps, schema_editor):
    group_model = apps.get_model("auth", "Group")
    for name in ROLE_GROUPS:
        group_model.objects.using(schema_editor.connection.alias).get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("auth", "0012_alter_user_first_name_max_length")]

    # Reversing keeps the groups: deleting them would silently drop every membership.
    operations = [migrations.RunPython(create_role_groups, migrations.RunPython.noop)]
