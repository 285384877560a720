from django.contrib import messages
from django.contrib.auth import views as auth_views

from taskhub.accounts.forms import SignInForm


class SignInView(auth_views.LoginView):
    # Failed sign-ins are not rate limited yet: that is issue 7.
    template_name = "accounts/login.html"
    authentication_form = SignInForm
    redirect_authenticated_user = True


class SignOutView(auth_views.LogoutView):
    """POST only (Django's rule since 5.0), then back to the sign-in page with a note."""

    def post(self, request, *args, **kwargs):
        response = super().post(request, *args, **kwargs)
        messages.info(request, "You are signed out.")
        return response
