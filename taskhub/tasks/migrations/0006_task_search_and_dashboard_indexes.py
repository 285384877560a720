from django.db import migrations, models, transaction
from django.db.utils import DatabaseError

# name -> the expression that queries.py compares with LIKE: the search text of ?q= (queries.SEARCH_TEXT_SQL, with
# the columns unqualified) and the tool of ?tool= (a part of its name).
SEARCH_TEXT = (
    "UPPER(COALESCE(status_message, '') || chr(10) || tool::text || chr(10) || COALESCE(remote_task_id::text, '')"
    " || chr(10) || COALESCE(arguments::text, '') || chr(10) || COALESCE(result::text, ''))"
)
INDEXES = {
    "task_tool_trgm": "UPPER(tool::text)",
    "task_search_trgm": SEARCH_TEXT,
}


def create_where_pg_trgm_is_available(apps, schema_editor):
    """The list's `?q=` searches the status message, the tool, the server's task id, the arguments and the result
    as one text; `?tool=` matches part of a name. Both are `UPPER(…) LIKE '%…%'`, which these GIN trigram indexes
    answer, so a search reads the matching tasks instead of every task. As in 0005: nothing where pg_trgm is
    missing (the embedded Postgres), and the search works the same, by a sequential scan."""
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
        for name, expression in INDEXES.items():
            cursor.execute(f"CREATE INDEX IF NOT EXISTS {name} ON tasks_task USING gin (({expression}) gin_trgm_ops)")


def drop(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        for name in INDEXES:
            cursor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    # Like 0005's, these indexes are not in Task.Meta.indexes (the model state): they exist only where pg_trgm does.
    dependencies = [("tasks", "0005_task_status_message_trgm")]

    operations = [
        migrations.RunPython(create_where_pg_trgm_is_available, drop),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(finished_at__isnull=False), fields=["finished_at"], name="task_finished"
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(cancel_requested_at__isnull=False),
                fields=["cancel_requested_at"],
                name="task_cancel_requested",
            ),
        ),
    ]
