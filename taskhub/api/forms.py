"""The form that creates an API token on the tokens page."""

from datetime import timedelta

from django import forms
from django.utils import timezone

EXPIRY_CHOICES = [
    ("7", "in 7 days"),
    ("30", "in 30 days"),
    ("90", "in 90 days"),
    ("365", "in a year"),
    ("never", "never"),
]


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        strip=True,
        help_text="What it is for, e.g. “CI pipeline” — you see it in the list and the audit trail.",
    )
    expires = forms.ChoiceField(choices=EXPIRY_CHOICES, initial="90", label="Expires")

    def expires_at(self):
        choice = self.cleaned_data["expires"]
        return None if choice == "never" else timezone.now() + timedelta(days=int(choice))
