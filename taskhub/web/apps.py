from django.apps import AppConfig


class WebConfig(AppConfig):
    name = "taskhub.web"
    label = "web"
    verbose_name = "taskhub web pages"
