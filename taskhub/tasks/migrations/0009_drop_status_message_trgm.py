from django.db import migrations, transaction
from django.db.utils import DatabaseError

# 0005's index on the status message alone. Nothing compares UPPER(status_message) on its own any more: the list's,
# the API's and `manage.py tasks`' ?q= search one text of every field (queries.SEARCH_TEXT_SQL), which 0006's
# task_search_trgm answers; keeping this one only cost every task write a second GIN update.
INDEX = "task_status_message_trgm"


def drop(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")


def recreate_where_pg_trgm_is_available(apps, schema_editor):
    """Back to 0006: the index again, where 0005 made it (pg_trgm available and the extension created)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_extension WHERE extname = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        try:
            with transaction.atomic(using=schema_editor.connection.alias):
                cursor.execute(
                    f"CREATE INDEX IF NOT EXISTS {INDEX} ON tasks_task USING gin (UPPER(status_message) gin_trgm_ops)"
                )
        except DatabaseError:
            return


class Migration(migrations.Migration):
    dependencies = [("tasks", "0008_task_launch_attempts")]

    operations = [migrations.RunPython(drop, recreate_where_pg_trgm_is_available)]
