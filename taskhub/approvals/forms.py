import json

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from taskhub.approvals.models import (
    MAX_REQUIRED_ACCEPTS,
    ApprovalPolicy,
    AtDeadline,
    InputFrom,
    WebhookFormat,
    parse_answer_within,
    say_duration,
)
from taskhub.servers.models import Server

# Django's own words for an empty choice (its catalogue has no zh-Hans for them yet).
CHOOSE_ONE = _("- Select an option -")


class PolicyForm(forms.Form):
    server = forms.ModelChoiceField(
        queryset=Server.objects.filter(removed_at__isnull=True).order_by("name"),
        label=_("Server"),
        empty_label=CHOOSE_ONE,
    )
    tool = forms.CharField(
        required=False,
        max_length=200,
        label=_("Tool"),
        help_text=_("Empty: every tool of the server that has no policy of its own."),
    )
    groups = forms.ModelMultipleChoiceField(
        queryset=Group.objects.order_by("name"), required=False, widget=forms.CheckboxSelectMultiple, label=_("Groups")
    )
    users = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.filter(is_active=True).order_by("username"),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label=_("Users"),
        help_text=_("Approvers in a ticked group or ticked by name answer; none ticked: every approver."),
    )
    required_accepts = forms.IntegerField(
        label=_("Acceptances needed"),
        min_value=1,
        max_value=MAX_REQUIRED_ACCEPTS,
        initial=1,
        help_text=_("How many different people must accept before the answer is sent (N of M)."),
    )
    allow_self_approval = forms.BooleanField(
        required=False, label=_("The person who launched the task may answer its requests")
    )
    comment_required_on_decline = forms.BooleanField(required=False, label=_("A decline needs a comment"))
    gate_before_call = forms.BooleanField(
        required=False,
        label=_("Needs approval before it runs"),
        help_text=_("A launch is not sent to the server until approved; declined, the task ends not approved."),
    )

    answer_within = forms.CharField(
        required=False,
        max_length=40,
        label=_("Answer within"),
        help_text=_(
            "e.g. 30 min, 4 h, 1 day; empty: no deadline. Counted from when each request opens; a change here "
            "applies to requests that open afterwards, never to deadlines already running."
        ),
    )
    at_deadline = forms.ChoiceField(
        choices=AtDeadline.choices,
        initial=AtDeadline.DECLINE,
        required=False,  # only read with a deadline; none chosen is a decline
        label=_("At the deadline"),
        widget=forms.RadioSelect,
    )
    deadline_answer = forms.CharField(
        required=False,
        label=_("Fixed answer (JSON)"),
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text=_(
            'For "send a fixed answer": e.g. {"action": "accept", "content": {"approved": false}}. A request '
            "whose form it does not fit is declined instead, and the audit trail says why."
        ),
    )
    escalation_group = forms.ModelChoiceField(
        queryset=Group.objects.order_by("name"),
        required=False,
        label=_("Escalation group"),
        empty_label=CHOOSE_ONE,
        help_text=_('For "hand it to an escalation group": its approvers answer the request from then on.'),
    )

    def clean_answer_within(self):
        text = self.cleaned_data["answer_within"]
        try:
            return parse_answer_within(text)
        except ValueError as unreadable:
            said = gettext("%(value)s is not a duration: write e.g. 30 min, 2 h, 1 day, 45 s.")
            raise forms.ValidationError(said % {"value": repr(text.strip().lower()[:40])}) from unreadable

    def clean_at_deadline(self):
        return self.cleaned_data["at_deadline"] or AtDeadline.DECLINE

    def clean_deadline_answer(self):
        text = self.cleaned_data["deadline_answer"].strip()
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError as unreadable:
            raise forms.ValidationError(gettext("This is not JSON: %(error)s.") % {"error": unreadable}) from unreadable

    input_from = forms.ChoiceField(
        required=False,  # a form that does not send it (an older page, a script) keeps the default: people
        label=_("Requests of an agent's calls answered by"),
        choices=InputFrom.choices,
        initial=InputFrom.PEOPLE,
        help_text=_("For calls an agent makes through the gateway: people in the inbox, or the agent itself."),
    )

    @classmethod
    def for_policy(cls, policy: ApprovalPolicy | None, data=None, initial=None):
        if policy is not None:  # also when bound: the edit page's server field is disabled, and reads its initial
            initial = {
                "server": policy.server,
                "tool": policy.tool,
                "groups": list(policy.groups.all()),
                "users": list(policy.users.all()),
                "required_accepts": policy.required_accepts,
                "allow_self_approval": policy.allow_self_approval,
                "comment_required_on_decline": policy.comment_required_on_decline,
                "gate_before_call": policy.gate_before_call,
                "answer_within": say_duration(policy.answer_within),
                "at_deadline": policy.at_deadline,
                "deadline_answer": json.dumps(policy.deadline_answer) if policy.deadline_answer is not None else "",
                "escalation_group": policy.escalation_group,
                "input_from": policy.input_from,
            }
        return cls(data=data, initial=initial)

    def terms(self) -> dict:
        data = self.cleaned_data
        return {
            "tool": data["tool"],
            "required_accepts": data["required_accepts"],
            "allow_self_approval": data["allow_self_approval"],
            "comment_required_on_decline": data["comment_required_on_decline"],
            "gate_before_call": data["gate_before_call"],
            "answer_within": data["answer_within"],
            "at_deadline": data["at_deadline"],
            "deadline_answer": data["deadline_answer"],
            "escalation_group": data["escalation_group"],
            "input_from": data["input_from"] or InputFrom.PEOPLE,
        }


class WebhookForm(forms.Form):
    url = forms.URLField(
        label="URL",
        max_length=2000,
        assume_scheme="https",
        help_text=_(
            "taskhub POSTs here when a request under this policy waits, its deadline is near, or a default is applied."
        ),
    )
    secret = forms.CharField(
        required=False,
        max_length=500,
        strip=True,
        widget=forms.PasswordInput(render_value=False),
        label=_("Secret"),
        help_text=_("Signs each delivery (X-Taskhub-Signature); never shown again. A Slack webhook may have none."),
    )
    format = forms.ChoiceField(choices=WebhookFormat.choices, initial=WebhookFormat.JSON, label=_("Format"))
    enabled = forms.BooleanField(required=False, initial=True, label=_("Send deliveries"))
