from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "taskhub.web"
    label = "web"
    verbose_name = "taskhub web pages"

    def ready(self) -> None:
        from taskhub.observability import tracing

        # Traces are off unless the environment asks for them (TASKHUB_TRACING, OTEL_EXPORTER_OTLP_ENDPOINT).
        tracing.configure_from_environment()
