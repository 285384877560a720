from django.db import migrations


class Migration(migrations.Migration):
    """Leave room in each page of the tracker's table so rescheduling rewrites a row in its own page."""

    dependencies = (("tasks", "0001_initial"),)

    operations = (
        migrations.RunSQL(
            sql="ALTER TABLE tasks_taskpoll SET (fillfactor = 70)",
            reverse_sql="ALTER TABLE tasks_taskpoll RESET (fillfactor)",
        ),
    )
