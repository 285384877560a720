import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    """Cheap counts on pages at scale (bench/pages.py): an input request carries its task's server, so the open
    requests a user may answer are counted from a partial index without joining tasks; and the task indexes
    that lead with server or launcher include status, so the list's tab counts under those filters are
    index-only scans."""

    dependencies = [
        ("servers", "0001_initial"),
        ("tasks", "0003_input_request_delivery_attempted"),
    ]

    operations = [
        migrations.AddField(
            model_name="inputrequest",
            name="server",
            field=models.ForeignKey(
                null=True,
                db_index=False,
                editable=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="servers.server",
            ),
        ),
        migrations.RunSQL(
            sql="UPDATE tasks_inputrequest AS ir SET server_id = t.server_id FROM tasks_task AS t "
            "WHERE t.id = ir.task_id",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.AlterField(
            model_name="inputrequest",
            name="server",
            field=models.ForeignKey(
                db_index=False,
                editable=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="servers.server",
            ),
        ),
        migrations.AddIndex(
            model_name="inputrequest",
            index=models.Index(
                condition=models.Q(("state", "open")), fields=["server"], name="input_request_open_server"
            ),
        ),
        migrations.RemoveIndex(model_name="task", name="task_server_created"),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(fields=["server", "-created_at"], include=["status"], name="task_server_created"),
        ),
        migrations.RemoveIndex(model_name="task", name="task_launcher_created"),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(fields=["launched_by", "-created_at"], include=["status"], name="task_launcher_created"),
        ),
    ]
