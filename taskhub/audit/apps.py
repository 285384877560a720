from django.apps import AppConfig
from django.db.models.signals import post_migrate


class AuditConfig(AppConfig):
    name = "taskhub.audit"
    label = "audit"
    verbose_name = "audit trail"

    def ready(self) -> None:
        from taskhub.database.roles import grant_after_migrate

        # Once per migrate (for this app), after every app's migrations: a separate application role's grants.
        post_migrate.connect(grant_after_migrate, sender=self, dispatch_uid="taskhub.database.roles")
