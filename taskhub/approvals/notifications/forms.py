from django import forms
from django.utils.translation import gettext_lazy as _

from taskhub.approvals.models import SWITCHED_KINDS


class PreferencesForm(forms.Form):
    email = forms.EmailField(
        required=False,
        max_length=254,
        label=_("Email address"),
        help_text=_("Where the mails go. Empty: taskhub mails you nothing."),
    )
    request_waiting = forms.BooleanField(
        required=False,
        label=_("A request waits for me"),
        help_text=_("A server (or a gated launch) asks a question that you may answer."),
    )
    deadline_near = forms.BooleanField(
        required=False,
        label=_("Its answer deadline is near"),
        help_text=_("A request you may answer will soon get its policy's default answer."),
    )
    default_applied = forms.BooleanField(
        required=False,
        label=_("A default was applied"),
        help_text=_("Nobody answered in time, and taskhub did what the policy says, on a request you could answer."),
    )
    task_finished = forms.BooleanField(
        required=False,
        label=_("A task I launched finished"),
        help_text=_("Completed, failed, cancelled, expired or lost. Off unless you turn it on."),
    )

    SWITCHES = SWITCHED_KINDS

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for name in self.SWITCHES:  # each box is described by its hint (the page renders it under the label)
            self.fields[name].widget.attrs["aria-describedby"] = f"id_{name}-hint"

    def switches(self) -> dict[str, bool]:
        return {name: self.cleaned_data[name] for name in self.SWITCHES}
