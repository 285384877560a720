from typing import ClassVar

from django.contrib.auth.forms import AuthenticationForm
from django.utils.translation import gettext_lazy as _


class SignInForm(AuthenticationForm):
    error_messages: ClassVar[dict] = {
        **AuthenticationForm.error_messages,
        "invalid_login": _(
            "That username and password do not match an account. Check both (they are "
            "case-sensitive) and try again, or ask an admin to reset your password."
        ),
        "inactive": _("This account is switched off. Ask an admin to turn it back on."),
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["username"].widget.attrs["autocomplete"] = "username"
        self.fields["password"].widget.attrs["autocomplete"] = "current-password"
