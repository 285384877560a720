from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    # The database cache (settings.CACHES without REDIS_URL) holds the sign-in rate limit's counters.
    # createcachetable creates only the tables the configured caches need, and skips existing ones.
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_role_groups")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
