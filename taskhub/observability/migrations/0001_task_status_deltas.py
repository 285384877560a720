from django.db import migrations, models

# INSERT and DELETE: once per statement, grouped (a bulk insert or the retention purge adds a row per server and
# status, not per task). UPDATE: per row, and only when the status changes (transition tables cannot be limited to
# a column, and most updates of a task do not change its status).
CREATE_TRIGGERS = """
CREATE FUNCTION observability_tasks_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_taskstatusdelta (server_id, status, delta)
    SELECT server_id, status, count(*) FROM inserted_tasks GROUP BY server_id, status;
    RETURN NULL;
END $$;

CREATE FUNCTION observability_tasks_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_taskstatusdelta (server_id, status, delta)
    SELECT server_id, status, -count(*) FROM deleted_tasks GROUP BY server_id, status;
    RETURN NULL;
END $$;

CREATE FUNCTION observability_task_status_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_taskstatusdelta (server_id, status, delta)
    VALUES (OLD.server_id, OLD.status, -1), (NEW.server_id, NEW.status, 1);
    RETURN NULL;
END $$;

CREATE TRIGGER observability_tasks_inserted AFTER INSERT ON tasks_task
    REFERENCING NEW TABLE AS inserted_tasks FOR EACH STATEMENT EXECUTE FUNCTION observability_tasks_inserted();
CREATE TRIGGER observability_tasks_deleted AFTER DELETE ON tasks_task
    REFERENCING OLD TABLE AS deleted_tasks FOR EACH STATEMENT EXECUTE FUNCTION observability_tasks_deleted();
CREATE TRIGGER observability_task_status_changed AFTER UPDATE OF status, server_id ON tasks_task
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.server_id IS DISTINCT FROM NEW.server_id)
    EXECUTE FUNCTION observability_task_status_changed();

INSERT INTO observability_taskstatusdelta (server_id, status, delta)
SELECT server_id, status, count(*) FROM tasks_task GROUP BY server_id, status;
"""

DROP_TRIGGERS = """
DROP TRIGGER observability_task_status_changed ON tasks_task;
DROP TRIGGER observability_tasks_deleted ON tasks_task;
DROP TRIGGER observability_tasks_inserted ON tasks_task;
DROP FUNCTION observability_task_status_changed();
DROP FUNCTION observability_tasks_deleted();
DROP FUNCTION observability_tasks_inserted();
"""


class Migration(migrations.Migration):
    initial = True

    dependencies = [("tasks", "0005_task_status_message_trgm")]

    operations = [
        migrations.CreateModel(
            name="TaskStatusDelta",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("server_id", models.BigIntegerField()),
                ("status", models.CharField(max_length=16)),
                ("delta", models.BigIntegerField()),
            ],
            options={"verbose_name": "task status delta"},
        ),
        migrations.RunSQL(CREATE_TRIGGERS, DROP_TRIGGERS),
    ]
