"""A person's choice of mails: read with their defaults, saved in one transaction with its audit row."""

from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from taskhub.approvals.models import SWITCHED_KINDS, NotificationPreferences
from taskhub.audit.services import record_event

SWITCHES = SWITCHED_KINDS


def preferences_of(user) -> NotificationPreferences:
    """The saved choices, or the defaults (unsaved: the row is created on the first save)."""
    return NotificationPreferences.objects.filter(user=user).first() or NotificationPreferences(user=user)


def describe(preferences: NotificationPreferences, email: str) -> dict[str, Any]:
    return {"email": email, **{switch: getattr(preferences, switch) for switch in SWITCHES}}


@transaction.atomic
def save_preferences(*, user, email: str, **switches: bool) -> dict[str, Any]:
    """Store the person's address and switches; return what changed (audited when anything did)."""
    unknown = set(switches) - set(SWITCHES)
    if unknown:
        raise TypeError(f"save_preferences cannot change {sorted(unknown)}")
    person = get_user_model().objects.select_for_update(no_key=True).get(pk=user.pk)
    preferences, _ = NotificationPreferences.objects.select_for_update(no_key=True).get_or_create(user=person)
    before = describe(preferences, person.email)
    for switch, value in switches.items():
        setattr(preferences, switch, bool(value))
    preferences.save()
    email = (email or "").strip()
    if email != person.email:
        person.email = email
        person.save(update_fields=["email"])
    after = describe(preferences, person.email)
    changed = {name: value for name, value in after.items() if before[name] != value}
    if changed:
        record_event(action="notification.preferences_changed", user=person, data={"changed": changed})
    user.email = person.email
    return changed
