from typing import ClassVar

from django.contrib.auth.forms import AuthenticationForm


class SignInForm(AuthenticationForm):
    error_messages: ClassVar[dict[str, str]] = {
        **AuthenticationForm.error_messages,
        "invalid_login": "That username and password do not match an account. Check both (they are "
        "case-sensitive) and try again, or ask an admin to reset your password.",
        "inactive": "This account is switched off. Ask an admin to turn it back on.",
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["username"].widget.attrs["autocomplete"] = "username"
        self.fields["password"].widget.attrs["autocomplete"] = "current-password"
