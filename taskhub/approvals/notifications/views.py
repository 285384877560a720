"""Each person's notification preferences page. Thin: preferences.py does the work."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.utils.translation import gettext as _

from taskhub.accounts.permissions import is_approver
from taskhub.approvals.notifications.forms import PreferencesForm
from taskhub.approvals.notifications.preferences import SWITCHES, preferences_of, save_preferences

TEMPLATE = "approvals/notification_preferences.html"


@login_required
def preferences(request):
    if request.method == "POST":
        form = PreferencesForm(data=request.POST)
        if form.is_valid():
            changed = save_preferences(user=request.user, email=form.cleaned_data["email"], **form.switches())
            messages.success(request, _("Your notification choices are saved.") if changed else _("Nothing changed."))
            return redirect("notifications:preferences")
    else:
        current = preferences_of(request.user)
        form = PreferencesForm(
            initial={"email": request.user.email, **{switch: getattr(current, switch) for switch in SWITCHES}}
        )
    context = {"form": form, "approver": is_approver(request.user), "approver_switches": SWITCHES[:3]}
    return render(request, TEMPLATE, context, status=400 if form.errors else 200)
