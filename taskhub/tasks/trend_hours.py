"""The hours of Home's trends (taskhub/tasks/trends.py): tasks started and ended per hour, the ended by outcome
(outcomes.outcome_counts_per), for the tasks a person may see.

An hour over for SETTLED_AFTER no longer changes: its counts are kept in the shared cache (a week of a busy table
costs 250 ms to count, the current hour a few) and, a week's at a time, by the process (hour_counts). What ended in
the last 24 hours is read once a request (ended_per_hour): Home's outcomes card sums it, its chart's current hour
takes its last hours.
"""

import contextlib
import datetime
import hashlib
import logging

from django.core.cache import cache
from django.db import connection
from django.db.models import Count
from django.db.models.functions import Trunc

from taskhub.accounts import permissions
from taskhub.tasks.outcomes import outcome_counts_of_rows, outcome_counts_per, outcome_rows
from taskhub.tasks.queries import ENDED_WITHIN
from taskhub.tasks.visible_reads import visible_rows

logger = logging.getLogger(__name__)

HOUR = datetime.timedelta(hours=1)
DAY = datetime.timedelta(days=1)
# What ended_per_hour counts: the task list's ?ended= of that name.
ENDED_WINDOW = "24h"
# An hour over for this long has its counts kept (hour_counts); a week and a day, past the chart's window.
SETTLED_AFTER = datetime.timedelta(minutes=2)
CACHE_SECONDS = 8 * 24 * 3600
EMPTY_HOUR = {"started": 0, "ended": {}}
# The settled hours of a week this process has read or counted, in front of the shared cache: {(the cache keys'
# prefix, the week's first hour, how many are settled): {hour: counts}}.
KEPT_WEEKS = 200
_kept_weeks: dict[tuple, dict] = {}


def floor_to(moment: datetime.datetime, unit: str) -> datetime.datetime:
    moment = moment.astimezone(datetime.UTC).replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0) if unit == "day" else moment


def _count_hours(visible, *, since: datetime.datetime, until: datetime.datetime | None) -> dict:
    """{hour: {"started": n, "ended": {outcome: n}}} of the hours from `since` to `until` (None: on), the hours with
    tasks: the started through task_created, the ended (by outcome_counts_per) through task_finished."""
    ended = outcome_counts_per(visible.filter(**_within("finished_at", since, until)), per=_finished_hour())
    return _hours_of(_started_per_hour(visible, since=since, until=until), ended, since=since, until=until)


def _within(field: str, since: datetime.datetime, until: datetime.datetime | None) -> dict:
    """The filter of `field` from `since` to `until` (None: on)."""
    return {f"{field}__gte": since} if until is None else {f"{field}__gte": since, f"{field}__lt": until}


def _started_per_hour(visible, since: datetime.datetime, until: datetime.datetime | None = None):
    return (
        visible.filter(**_within("created_at", since, until))
        .order_by()
        .annotate(per=Trunc("created_at", "hour", tzinfo=datetime.UTC))
        .values_list("per")
        .annotate(n=Count("*"))
        .values_list("per", "n")
    )


def _hours_of(started, ended: dict, *, since: datetime.datetime, until: datetime.datetime | None) -> dict:
    """The hours of _count_hours from the started per hour (rows of hour and count) and the ended per hour, counted
    over these hours at least."""
    hours: dict = {}
    for hour, n in started:
        hours.setdefault(hour, {"started": 0, "ended": {}})["started"] = n
    for hour, outcomes in ended.items():
        if hour >= since and (until is None or hour < until):
            hours.setdefault(hour, {"started": 0, "ended": {}})["ended"] = outcomes
    return hours


def _finished_hour() -> Trunc:
    return Trunc("finished_at", "hour", tzinfo=datetime.UTC)


def ended_per_hour(user, *, now: datetime.datetime) -> dict:
    """{hour: {outcome: n}} of the tasks `user` sees that ended in the 24 hours to `now` (ENDED_WINDOW), read once
    for the HTTP request: Home's "Ended in the last 24 hours" (their sum) and its chart's current hour (its last
    hours) both take them, given the same `now`."""
    since = now - ENDED_WITHIN[ENDED_WINDOW]
    return permissions.read_once_per_request(
        f"ended per hour since {since.isoformat()}",
        user,
        lambda: outcome_counts_of_rows(visible_rows(user, "ended per hour", _ended_rows, since)),
    )


def _ended_rows(visible, since: datetime.datetime):
    return outcome_rows(visible.filter(finished_at__gte=since), per=_finished_hour())


def _scope(user) -> str:
    """Which tasks `user` sees, as a cache key's part: every task, or those of these servers."""
    if permissions.sees_all_tasks(user):
        return "all"
    ids = sorted(permissions.approvable_servers(user))
    return "servers-" + hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def hour_counts(user, visible, *, first: datetime.datetime, now: datetime.datetime) -> dict:
    """{hour: {"started": n, "ended": {outcome: n}}} for every hour from `first` to now's. An hour over for
    SETTLED_AFTER no longer changes (a task's created_at is fixed, its finished_at written once, when it ends), so
    its counts are kept in the cache per set of visible tasks, and the week's settled hours by this process as it
    first reads or counts them; only the hours since are counted each time, a few hundred tasks an hour where the
    full 7 days are ~90,000 (bench/pages.py's rate, whatever its total)."""
    hours = (floor_to(now, "hour") - first) // HOUR + 1
    settled_hours = max(0, min(hours, (now - SETTLED_AFTER - HOUR - first) // HOUR + 1))
    prefix = f"trends:{connection.settings_dict['NAME']}:{_scope(user)}:"
    week = (prefix, first, settled_hours)
    settled = _kept_weeks.get(week)
    if settled is None:
        settled = _settled_counts(visible, prefix, [first + HOUR * n for n in range(settled_hours)])
        if len(_kept_weeks) >= KEPT_WEEKS:
            _kept_weeks.clear()
        _kept_weeks[week] = settled
    since = first + HOUR * settled_hours  # within the last 24 hours: ended_per_hour has them
    started = visible_rows(user, "started per hour", _started_per_hour, since)
    counted = _hours_of(started, ended_per_hour(user, now=now), since=since, until=None)
    unsettled = (since + HOUR * n for n in range(hours - settled_hours))
    return settled | {hour: counted.get(hour, EMPTY_HOUR) for hour in unsettled}


def _settled_counts(visible, prefix: str, settled: list[datetime.datetime]) -> dict:
    """The counts of these settled hours: from the shared cache, or counted (and put there)."""
    keys = {hour: prefix + hour.strftime("%Y%m%d%H") for hour in settled}
    try:
        cached, reachable = cache.get_many(list(keys.values())), True
    except Exception as error:  # the cache is Redis, and Redis is away: counted from the database (slower), no 500
        logger.warning("trends: the cache could not be read (%s); the week is counted from the database", error)
        cached, reachable = {}, False
    missing = [hour for hour in settled if keys[hour] not in cached]
    counted = {}
    if missing:
        counted = _count_hours(visible, since=missing[0], until=missing[-1] + HOUR)
        if reachable:
            with contextlib.suppress(Exception):  # kept next time, if the cache can take it
                cache.set_many({keys[hour]: counted.get(hour, EMPTY_HOUR) for hour in missing}, timeout=CACHE_SECONDS)
    return {hour: cached.get(keys[hour], counted.get(hour, EMPTY_HOUR)) for hour in settled}


def forget_kept_hours() -> None:
    """The settled hours this process kept (a test's database is emptied after it; the hours are not)."""
    _kept_weeks.clear()
