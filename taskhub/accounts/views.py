from django.contrib import messages
from django.contrib.auth import views as auth_views

from taskhub.accounts import ratelimit
from taskhub.accounts.forms import SignInForm


class SignInView(auth_views.LoginView):
    """Sign-in, rate limited (ratelimit.py): over the limit the form answers 429 without checking the password."""

    template_name = "accounts/login.html"
    authentication_form = SignInForm
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        username = request.POST.get("username", "")
        address = ratelimit.client_address(request)
        wait = ratelimit.seconds_locked(username, address)
        if wait:
            form = self.get_form()
            form.errors.clear()  # is_valid() was not called: no authentication happens while locked
            form.add_error(None, ratelimit.lockout_message(wait))
            form.cleaned_data = {}
            return self.render_to_response(self.get_context_data(form=form), status=429)
        return super().post(request, *args, **kwargs)

    # Failures are counted, and a success clears the username's count, by the user_login_failed and
    # user_logged_in signals (accounts/apps.py), so the admin site's sign-in counts the same way.


class SignOutView(auth_views.LogoutView):
    """POST only (Django's rule since 5.0), then back to the sign-in page with a note."""

    def post(self, request, *args, **kwargs):
        response = super().post(request, *args, **kwargs)
        messages.info(request, "You are signed out.")
        return response
