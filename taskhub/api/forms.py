"""The form that creates an API token on the tokens page."""

from datetime import timedelta

from django import forms
from django.utils import timezone
from django.utils.translation import gettext_lazy

EXPIRY_CHOICES = [
    ("7", gettext_lazy("in 7 days")),
    ("30", gettext_lazy("in 30 days")),
    ("90", gettext_lazy("in 90 days")),
    ("365", gettext_lazy("in a year")),
    ("never", gettext_lazy("never")),
]


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        strip=True,
        label=gettext_lazy("Name"),
        help_text=gettext_lazy("What it is for, e.g. “CI pipeline” — you see it in the list and the audit trail."),
    )
    expires = forms.ChoiceField(choices=EXPIRY_CHOICES, initial="90", label=gettext_lazy("Expires"))

    def expires_at(self):
        choice = self.cleaned_data["expires"]
        return None if choice == "never" else timezone.now() + timedelta(days=int(choice))
