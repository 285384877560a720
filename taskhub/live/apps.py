from django.apps import AppConfig

from taskhub.live import publish


class LiveConfig(AppConfig):
    name = "taskhub.live"
    label = "live"
    verbose_name = "live updates"

    def ready(self) -> None:
        from taskhub.live import task_fragments
        from taskhub.live.access import connect_access_signals
        from taskhub.tasks.signals import task_changed

        # The domain announces committed changes and never imports this layer (DESIGN.md, "Dependency direction").
        task_changed.connect(publish_task_changed, dispatch_uid="taskhub.live.task_changed")
        # Live sockets read their user's access again after roles, memberships or approver groups change.
        connect_access_signals()
        task_fragments.register()


def publish_task_changed(sender, *, task_id, server_id=None, asks=False, **kwargs) -> None:
    publish.publish_task_changed(task_id, server_id=server_id, asks=asks)
