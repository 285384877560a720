"""The People pages, for admins: everyone with their groups and state, a form to add someone, and a page per person
to set their groups, deactivate or reactivate them and reset their password. Thin: the changes are people.py's."""

from django import forms
from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db.models import Prefetch
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _
from django.views.decorators.http import require_http_methods, require_POST

from taskhub.accounts import people
from taskhub.accounts.groups import ROLE_GROUPS
from taskhub.accounts.permissions import admin_required

ROLE_WORDS = {
    "approvers": _("approver: answers the inbox"),
    "operators": _("operator: launches and cancels"),
    "admins": _("admin: servers, approvals, audit, people"),
    "agents": _("agent: launches through API tokens only"),
}


class GroupsField(forms.ModelMultipleChoiceField):
    widget = forms.CheckboxSelectMultiple

    def label_from_instance(self, group):
        return ROLE_WORDS.get(group.name, group.name)


def groups_field() -> GroupsField:
    # The role groups first, then the approver groups the approval policies name.
    ordered = sorted(Group.objects.all(), key=lambda group: (group.name not in ROLE_GROUPS, group.name))
    field = GroupsField(queryset=Group.objects.all(), required=False, label=_("Groups"))
    field.choices = [(group.pk, field.label_from_instance(group)) for group in ordered]
    return field


class PersonForm(forms.Form):
    username = forms.CharField(max_length=150, label=_("Username"))
    email = forms.EmailField(
        required=False, label=_("Email"), help_text=_("For notification mails; they can change it later.")
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["groups"] = groups_field()


class GroupsForm(forms.Form):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["groups"] = groups_field()


def _everyone():
    return (
        get_user_model()
        .objects.prefetch_related(Prefetch("groups", queryset=Group.objects.order_by("name")))
        .order_by("-is_active", "username")
    )


@admin_required
@require_http_methods(["GET", "POST"])
def people_list(request):
    form = PersonForm(request.POST if request.method == "POST" else None)
    added = None
    if request.method == "POST" and form.is_valid():
        try:
            user, password = people.add_person(
                username=form.cleaned_data["username"],
                email=form.cleaned_data["email"],
                groups=form.cleaned_data["groups"],
                by=request.user,
            )
        except people.PeopleRefused as refused:
            form.add_error("username", str(refused))
        else:
            added = {"user": user, "password": password}
            form = PersonForm()
    status = 400 if request.method == "POST" and form.errors else 200
    context = {"form": form, "added": added, "everyone": _everyone()}
    return render(request, "accounts/people.html", context, status=status)


@admin_required
@require_http_methods(["GET", "POST"])
def person_detail(request, user_id: int):
    person = get_object_or_404(get_user_model(), pk=user_id)
    form = GroupsForm(request.POST if request.method == "POST" else None, initial={"groups": list(person.groups.all())})
    if request.method == "POST":
        if form.is_valid():
            try:
                people.set_groups(user=person, groups=form.cleaned_data["groups"], by=request.user)
            except people.PeopleRefused as refused:
                form.add_error(None, str(refused))
            else:
                messages.success(request, gettext("%(person)s's groups are saved.") % {"person": person.get_username()})
                return redirect("people:detail", user_id=person.pk)
        return _detail(request, person, form, status=400)
    return _detail(request, person, form)


def _detail(request, person, form, *, status: int = 200, password: str = ""):
    context = {"person": person, "form": form, "password": password}
    return render(request, "accounts/person.html", context, status=status)


@admin_required
@require_POST
def person_state(request, user_id: int):
    """Deactivate (ends their sessions, sockets and tokens) or reactivate."""
    person = get_object_or_404(get_user_model(), pk=user_id)
    try:
        if request.POST.get("active") == "no":
            ended = people.deactivate_person(user=person, by=request.user)
            messages.success(
                request,
                gettext("%(person)s is deactivated: %(sessions)d session(s) ended, %(tokens)d API token(s) revoked.")
                % {"person": person.get_username(), "sessions": ended["sessions"], "tokens": ended["tokens"]},
            )
        elif request.POST.get("active") == "yes":
            people.reactivate_person(user=person, by=request.user)
            messages.success(
                request,
                gettext("%(person)s is active again (their old tokens stay revoked).")
                % {"person": person.get_username()},
            )
        else:
            messages.error(request, gettext("Nothing was changed: say whether to deactivate or reactivate."))
    except people.PeopleRefused as refused:
        messages.error(request, str(refused))
    return redirect("people:detail", user_id=person.pk)


@admin_required
@require_POST
def person_password(request, user_id: int):
    person = get_object_or_404(get_user_model(), pk=user_id)
    if request.POST.get("confirm") != "yes":
        messages.error(request, gettext("Nothing was changed: tick the box to confirm the reset."))
        return redirect("people:detail", user_id=person.pk)
    password = people.reset_password(user=person, by=request.user)
    form = GroupsForm(initial={"groups": list(person.groups.all())})
    return _detail(request, person, form, password=password)
