"""How long something took, or lasts, in the reader's language: the one way taskhub's pages, cards and mails say a
duration (a task's run, Home's percentiles, a task's TTL and poll interval, a policy's deadline)."""

from django.utils.translation import gettext, ngettext


def duration_text(seconds: float | None) -> str:
    """20 ms, 3.2 s, 4 min 10 s, 2 h 5 min, 3 days 4 h: two units at most, "1 day" not "1 days"; "—" for none."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return gettext("%(value)s ms") % {"value": f"{seconds * 1000:.0f}"}
    if seconds < 10:
        return gettext("%(seconds)s s") % {"seconds": f"{seconds:.1f}".removesuffix(".0")}
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    day_text = ngettext("%(days)d day", "%(days)d days", days) % {"days": days}
    hour_text = gettext("%(hours)d h") % {"hours": hours}
    minute_text = gettext("%(minutes)d min") % {"minutes": minutes}
    second_text = gettext("%(seconds)s s") % {"seconds": secs}
    if days:
        return f"{day_text} {hour_text}" if hours else day_text
    if hours:
        return f"{hour_text} {minute_text}" if minutes else hour_text
    if minutes:
        return f"{minute_text} {second_text}" if secs else minute_text
    return second_text
