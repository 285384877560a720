from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "taskhub.worker"
    label = "worker"
    verbose_name = "background work"
