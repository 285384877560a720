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
        with ratelimit.one_of_few_sign_ins():  # a burst of sign-ins waits here, not each on a connection of its own
            username = request.POST.get("username", "")
            wait = ratelimit.seconds_locked(username, ratelimit.client_address(request))
            if wait:
                return self._locked(self.get_form(), wait)
            return super().post(request, *args, **kwargs)

    def form_invalid(self, form):
        # The backend refused the guess uncounted and unchecked: the limit was reached meanwhile (concurrent
        # attempts; the read in post() is only the quick answer).
        wait = getattr(self.request, ratelimit.REFUSED_ATTRIBUTE, None)
        if wait:
            return self._locked(form, wait)
        return super().form_invalid(form)

    def _locked(self, form, wait: int):
        form.errors.clear()  # no password was checked
        form.add_error(None, ratelimit.lockout_message(wait))
        form.cleaned_data = {}
        return self.render_to_response(self.get_context_data(form=form), status=429)

    # Guesses are counted by the backend (backends.py) before the password is checked, and a right one taken
    # back by the user_logged_in signal (accounts/apps.py), so the admin site's sign-in counts the same way.


class SignOutView(auth_views.LogoutView):
    """POST only (Django's rule since 5.0), then back to the sign-in page with a note."""

    def post(self, request, *args, **kwargs):
        response = super().post(request, *args, **kwargs)
        messages.info(request, "You are signed out.")
        return response
