from django.apps import AppConfig


class ApprovalsConfig(AppConfig):
    name = "taskhub.approvals"
    label = "approvals"
    verbose_name = "approval policies"

    def ready(self) -> None:
        from taskhub.accounts import permissions
        from taskhub.approvals.rules import PolicyRules

        # Who answers which requests, and on what terms: the layers below ask through this registry and never
        # import this package (DESIGN.md, "Dependency direction").
        permissions.register_answer_policies(PolicyRules())

        from taskhub.approvals import signals, webhooks
        from taskhub.tasks.signals import input_requests_opened

        # Outgoing webhooks: each event queues its deliveries (one transaction, after the event's has committed).
        input_requests_opened.connect(webhooks.on_input_requests_opened, dispatch_uid="approval-webhooks-waiting")
        signals.deadline_near.connect(webhooks.on_deadline_near, dispatch_uid="approval-webhooks-deadline-near")
        signals.default_applied.connect(webhooks.on_default_applied, dispatch_uid="approval-webhooks-default")

        # Mail notifications listen to what the domain and the approval rules announce after commit.
        from taskhub.approvals.notifications import receivers

        receivers.connect()
