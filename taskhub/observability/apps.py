from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    name = "taskhub.observability"
    label = "observability"
    verbose_name = "observability"

    def ready(self) -> None:
        from taskhub.observability import metrics

        metrics.count_database_queries()
        metrics.clean_up_at_exit()
