from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "taskhub.tasks"
    label = "tasks"
    verbose_name = "tasks"

    def ready(self) -> None:
        from taskhub.tasks import live, live_inbox  # noqa: F401 - live_inbox registers the inbox's fragments

        live.register()
