from django.apps import AppConfig


class TasksConfig(AppConfig):
    name = "taskhub.tasks"
    label = "tasks"
    verbose_name = "tasks"
