from django.apps import AppConfig


class ServersConfig(AppConfig):
    name = "taskhub.servers"
    label = "servers"
    verbose_name = "MCP servers"
