from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "taskhub.api"
    label = "api"
    verbose_name = "JSON API"
