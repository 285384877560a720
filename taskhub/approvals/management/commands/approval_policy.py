"""manage.py approval_policy set|list|remove: the approval policies from a terminal (as the admins' page); and
add-webhook|webhooks|switch-webhook|remove-webhook: their outgoing webhooks."""

import json
import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandError

from taskhub.approvals import services, webhooks
from taskhub.approvals.models import ApprovalPolicy, AtDeadline, PolicyWebhook, WebhookFormat, parse_answer_within
from taskhub.approvals.rules import answerer_names, deadline_words
from taskhub.servers.models import Server


class Command(BaseCommand):
    help = "Set, list or remove approval policies (who answers a server's or a tool's requests, and how)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        setting = actions.add_parser("set", help="create or change the policy of a server (or of one of its tools)")
        setting.add_argument("server")
        setting.add_argument("--tool", default="", help="empty: every tool without a policy of its own")
        setting.add_argument("--group", action="append", default=None, help="a group that answers (repeat)")
        setting.add_argument("--user", action="append", default=None, help="a user who answers (repeat)")
        setting.add_argument("--accepts", type=int, default=None, help="acceptances needed (N of M)")
        setting.add_argument("--self-approval", choices=["allow", "refuse"], default=None)
        setting.add_argument("--comment-on-decline", choices=["required", "optional"], default=None)
        setting.add_argument(
            "--gate", choices=["before-call", "off"], default=None, help="needs approval before it runs, or not"
        )
        setting.add_argument(
            "--deadline", default=None, help='answer within this long ("30 min", "4 h", "1 day"); "off": no deadline'
        )
        setting.add_argument("--at-deadline", choices=AtDeadline.values, default=None, help="what happens at it")
        setting.add_argument("--deadline-answer", default=None, help='the fixed answer for "answer", as JSON')
        setting.add_argument("--escalate-to", default=None, help='the group that answers after "escalate"')
        setting.add_argument(
            "--input-from", choices=["people", "agent"], default=None, help="who answers an agent's calls' requests"
        )
        listing = actions.add_parser("list", help="the policies")
        listing.add_argument("--json", action="store_true")
        removing = actions.add_parser("remove", help="remove a policy")
        removing.add_argument("server")
        removing.add_argument("--tool", default="")

        adding = actions.add_parser("add-webhook", help="add a webhook to the policy of a server (or of a tool)")
        adding.add_argument("server")
        adding.add_argument("--tool", default="")
        adding.add_argument("--url", required=True)
        adding.add_argument("--format", choices=WebhookFormat.values, default=WebhookFormat.JSON)
        adding.add_argument(
            "--secret-stdin", action="store_true", help="read the secret from standard input (kept out of the history)"
        )
        adding.add_argument("--secret", default="", help="the secret (prefer --secret-stdin)")
        hooks_listing = actions.add_parser("webhooks", help="the webhooks of every policy")
        hooks_listing.add_argument("--json", action="store_true")
        switching = actions.add_parser("switch-webhook", help="turn a webhook on or off")
        switching.add_argument("webhook_id", type=int)
        switching.add_argument("state", choices=["on", "off"])
        unhooking = actions.add_parser("remove-webhook", help="remove a webhook, with its delivery log")
        unhooking.add_argument("webhook_id", type=int)

    def handle(self, *args, action, **options):
        if action == "list":
            return self._list(as_json=options["json"])
        if action == "webhooks":
            return self._webhooks(as_json=options["json"])
        if action in ("switch-webhook", "remove-webhook"):
            return self._change_webhook(action, options)
        server = Server.objects.filter(name=options["server"]).first()
        if server is None:
            raise CommandError(f"No server named {options['server']!r}.")
        policy = ApprovalPolicy.objects.filter(server=server, tool=options["tool"]).first()
        if action == "add-webhook":
            return self._add_webhook(policy, options)
        if action == "remove":
            if policy is None:
                raise CommandError(f"{server.name} has no policy for {options['tool'] or 'every tool'}.")
            services.remove_policy(policy=policy, user=None)
            self.stdout.write(f"removed the policy of {policy}")
            return None
        terms = {}
        if options["accepts"] is not None:
            terms["required_accepts"] = options["accepts"]
        if options["self_approval"] is not None:
            terms["allow_self_approval"] = options["self_approval"] == "allow"
        if options["comment_on_decline"] is not None:
            terms["comment_required_on_decline"] = options["comment_on_decline"] == "required"
        if options["gate"] is not None:
            terms["gate_before_call"] = options["gate"] == "before-call"
        terms.update(self._deadline_terms(options))
        if options["input_from"] is not None:
            terms["input_from"] = options["input_from"]
        groups = self._named(Group.objects.all(), "name", options["group"], "group")
        users = self._named(get_user_model().objects.all(), "username", options["user"], "user")
        try:
            if policy is None:
                policy = services.create_policy(
                    server=server, tool=options["tool"], groups=groups or (), users=users or (), user=None, **terms
                )
            else:
                policy = services.update_policy(policy=policy, groups=groups, users=users, user=None, **terms)
        except services.PolicyInvalid as invalid:
            raise CommandError(f"Not saved: {invalid}") from invalid
        self.stdout.write(
            f"{policy}: for {answerer_names(policy)}, {policy.required_accepts} acceptance(s) needed, "
            f"{deadline_words(policy)}"
        )
        return None

    def _deadline_terms(self, options) -> dict:
        terms = {}
        if options["deadline"] is not None:
            try:
                off = options["deadline"].strip().lower() == "off"
                terms["answer_within"] = None if off else parse_answer_within(options["deadline"])
            except ValueError as unreadable:
                raise CommandError(str(unreadable)) from unreadable
        if options["at_deadline"] is not None:
            terms["at_deadline"] = options["at_deadline"]
        if options["deadline_answer"] is not None:
            try:
                terms["deadline_answer"] = json.loads(options["deadline_answer"])
            except ValueError as unreadable:
                raise CommandError(f"--deadline-answer is not JSON: {unreadable}") from unreadable
        if options["escalate_to"] is not None:
            terms["escalation_group"] = self._named(Group.objects.all(), "name", [options["escalate_to"]], "group")[0]
        return terms

    def _named(self, queryset, field, names, what):
        if names is None:
            return None
        found = list(queryset.filter(**{f"{field}__in": names}))
        missing = set(names) - {getattr(row, field) for row in found}
        if missing:
            raise CommandError(f"No such {what}: {', '.join(sorted(missing))}")
        return found

    def _list(self, *, as_json: bool) -> None:
        policies = ApprovalPolicy.objects.select_related("server", "escalation_group").prefetch_related(
            "groups", "users"
        )
        rows = [
            {**services.describe_policy(policy), "for": answerer_names(policy), "deadline": deadline_words(policy)}
            for policy in policies
        ]
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for row in rows:
            self.stdout.write(
                f"{row['server']}\t{row['tool'] or '(every tool)'}\tfor {row['for']}\t{row['required_accepts']} needed"
                f"\t{row['deadline']}"
            )

    def _add_webhook(self, policy: ApprovalPolicy | None, options) -> None:
        if policy is None:
            what = options["tool"] or "every tool"
            raise CommandError(f"{options['server']} has no policy for {what}: set one first.")
        secret = sys.stdin.readline().strip() if options["secret_stdin"] else options["secret"]
        try:
            webhook = webhooks.create_webhook(
                policy=policy, url=options["url"], secret=secret, format=options["format"], user=None
            )
        except webhooks.WebhookInvalid as invalid:
            raise CommandError(f"Not added: {invalid}") from invalid
        self.stdout.write(f"webhook {webhook.pk} added to the policy of {policy}: {webhook}")

    def _change_webhook(self, action: str, options) -> None:
        webhook = PolicyWebhook.objects.filter(pk=options["webhook_id"]).first()
        if webhook is None:
            raise CommandError(f"No webhook {options['webhook_id']}.")
        if action == "remove-webhook":
            webhooks.remove_webhook(webhook=webhook, user=None)
            self.stdout.write(f"removed webhook {webhook.pk}")
            return
        webhooks.update_webhook(webhook=webhook, enabled=options["state"] == "on", user=None)
        self.stdout.write(f"webhook {webhook.pk} is {options['state']}")

    def _webhooks(self, *, as_json: bool) -> None:
        rows = [
            {
                "id": webhook.pk,
                "server": webhook.policy.server.name,
                "tool": webhook.policy.tool,
                "url": webhook.url,
                "format": webhook.format,
                "enabled": webhook.enabled,
                "secret": "set" if webhook.secret else "not set",
            }
            for webhook in PolicyWebhook.objects.select_related("policy__server").order_by("pk")
        ]
        if as_json:
            self.stdout.write(json.dumps(rows, indent=2))
            return
        for row in rows:
            state = "on" if row["enabled"] else "off"
            where = f"{row['server']}\t{row['tool'] or '(every tool)'}"
            self.stdout.write(f"{row['id']}\t{where}\t{row['format']}\t{state}\tsecret {row['secret']}\t{row['url']}")
