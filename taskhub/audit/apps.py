from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "taskhub.audit"
    label = "audit"
    verbose_name = "audit trail"
