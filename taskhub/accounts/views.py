from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.views.decorators.http import require_POST

from taskhub.accounts import ratelimit, sso
from taskhub.accounts.forms import SignInForm
from taskhub.accounts.language import LANGUAGE_CODES, choose


class SignInView(auth_views.LoginView):
    """Sign-in, rate limited (ratelimit.py): over the limit the form answers 429 without checking the password."""

    template_name = "accounts/login.html"
    authentication_form = SignInForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        context["local_passwords"] = settings.TASKHUB_LOCAL_PASSWORDS
        context["sso_provider"] = settings.TASKHUB_OIDC_PROVIDER_NAME if sso.enabled() else None
        context["sso_failed"] = sso.enabled() and self.request.GET.get("sso") == "failed"
        return context

    def post(self, request, *args, **kwargs):
        if not settings.TASKHUB_LOCAL_PASSWORDS:
            form = self.get_form()
            form.errors.clear()
            form.add_error(None, _("Passwords are turned off here: sign in through your organization's provider."))
            form.cleaned_data = {}
            return self.render_to_response(self.get_context_data(form=form), status=403)
        with ratelimit.one_of_few_sign_ins():  # a burst of sign-ins waits here, not each on a connection of its own
            username = request.POST.get("username", "")
            wait = ratelimit.seconds_locked(username, ratelimit.client_address(request))
            if wait:
                return self._locked(self.get_form(), wait)
            return super().post(request, *args, **kwargs)

    def form_valid(self, form):
        response = super().form_valid(form)
        sso.record_sign_in(user=form.get_user(), how={"method": "password"})
        return response

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
        messages.info(request, _("You are signed out."))
        return response


@require_POST
@login_required
def choose_language(request):
    """A person's language (their profile; '' = the browser's), then back to the page they chose it on."""
    language = request.POST.get("language", "")
    if language and language not in LANGUAGE_CODES:
        return HttpResponseBadRequest(_("Unknown language."))
    choose(request, language=language)
    messages.success(request, _("Your language is saved."))
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = reverse("notifications:preferences")
    return redirect(target)
