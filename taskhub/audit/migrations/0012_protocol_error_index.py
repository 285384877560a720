"""Home's "protocol errors in the last 24 hours" reads the day's protocol errors through this partial index, not every
audit event of the day. Postgres creates it on every month's partition."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("audit", "0011_sealed_after_commit"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="auditevent",
            index=models.Index(
                condition=models.Q(("action", "task.protocol_error")), fields=["time"], name="audit_protocol_error_time"
            ),
        ),
    ]
