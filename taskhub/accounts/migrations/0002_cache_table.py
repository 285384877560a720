from django.core.management import call_command
from django.db import migrations

# settings.CACHE_TABLE, written out so this migration means the same whatever the settings become.
CACHE_TABLE = "taskhub_cache"


def create_cache_table(apps, schema_editor):
    # The database cache (settings.CACHES without REDIS_URL) holds the sign-in rate limit's counters. Created
    # even while REDIS_URL is set, so dropping Redis later needs no extra step; an existing table is kept.
    call_command("createcachetable", CACHE_TABLE, database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_role_groups")]

    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
