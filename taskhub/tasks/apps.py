from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "taskhub.tasks"
    label = "tasks"
    verbose_name = "tasks"

    def ready(self):
        from taskhub.tasks import live_inbox  # noqa: F401 - registers the inbox's live fragments
