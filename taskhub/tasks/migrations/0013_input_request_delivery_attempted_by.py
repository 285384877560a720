from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0012_input_request_answer_deadline"),
    ]

    operations = [
        migrations.AddField(
            model_name="inputrequest",
            name="delivery_attempted_by",
            field=models.CharField(blank=True, db_default="", default="", max_length=200),
        ),
    ]
