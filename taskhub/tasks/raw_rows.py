"""Model instances from the columns of a hand-written statement, as the ORM would have built them.

A fork of two Django internals: what iterating a QuerySet does with a row (each field's database converters, then
Model.from_db) and what select_related leaves behind (the related instance in `_state.fields_cache`, so following
the relation reads nothing). taskhub needs it where one statement both changes and reads rows, which the ORM cannot
express: the delivery job's first claim (services.delivering.first_claim, an UPDATE … RETURNING of three tables);
and where a read the ORM would build again for every request is written once and prepared (the pages' rows and cards,
tasks/list_rows.py and tasks/card_requests.py: joined_read).
Written against Django 6.1: tests/test_forks.py fails on another minor version, and checks that instances built so
equal the ORM's and follow their relations without a query.
"""

import functools
from collections.abc import Sequence
from typing import Any

from django.db import connection

from taskhub.database import loading

FORKED_FROM_DJANGO = (6, 1)


def columns(alias: str, model: type, only: tuple[str, ...] | None = None) -> list[str]:
    """`alias."column"` for each concrete field of `model` (or of those named in `only`, with the primary key), in the
    order instances() reads them."""
    return [f'{alias}."{field.column}"' for field in _fields(model, only)]


def instances(row: Sequence[Any], models: Sequence[type], *, using=None, only: tuple[str, ...] | None = None) -> list:
    """One instance per model from a row holding each model's concrete columns in turn (columns()), converted as the
    ORM converts them (JSON, encrypted fields). `using`: the DatabaseWrapper the converters are given (default: the
    current connection; under asyncio, where Django's connections are per context, one the caller keeps). `only`: of
    one model, the fields columns() was given (the others are deferred, as QuerySet.only() leaves them)."""
    using = connection if using is None else using
    built, start = [], 0
    for model in models:
        attnames, converters = _reading(model, only)
        values = list(row[start : start + len(attnames)])
        if len(values) != len(attnames):
            raise ValueError(f"{model.__name__}: {len(attnames)} columns expected, {len(values)} given")
        for index, field_converters in converters:
            value = values[index]
            for converter in field_converters:
                value = converter(value, None, using)
            values[index] = value
        built.append(loading.from_db(model, using.alias, attnames, values))
        start += len(attnames)
    return built


def _fields(model: type, only: tuple[str, ...] | None) -> list:
    fields = model._meta.concrete_fields
    if only is None:
        return list(fields)
    return [field for field in fields if field.primary_key or field.name in only]


@functools.cache
def _reading(model: type, only: tuple[str, ...] | None) -> tuple[list[str], tuple]:
    """The fields' attribute names, and the database converters of those that have any, by position (a field's
    converters are its own: from_db_value, a foreign key's target's)."""
    fields = _fields(model, only)
    converters = tuple(
        (index, tuple(found)) for index, field in enumerate(fields) if (found := field.get_db_converters(connection))
    )
    return [field.attname for field in fields], converters


def relate(instance, field_name: str, related) -> None:
    """`instance.<field_name>` is `related` from now on, read from nothing (as select_related leaves it)."""
    instance._state.fields_cache[field_name] = related


def joined_read(*reads: tuple, where: str, also: str = "") -> tuple[str, tuple[int, ...]]:
    """A statement reading several models' columns in one row, and where each model's columns end in it (each
    instances() call takes its slice). `reads`: (alias, model, only, on, optional) each, the first read FROM (its `on`
    None), the others joined ON `on` (LEFT JOIN where `optional`: the row may have none); `also`: more of the select
    list, after the models' columns; `where`: the statement's WHERE and what follows it."""
    selected, ends, joins, at = [], [], [], 0
    for alias, model, only, on, optional in reads:
        read = columns(alias, model, only)
        selected += read
        at += len(read)
        ends.append(at)
        table = f'"{model._meta.db_table}" {alias}'
        joins.append(table if on is None else f"{'LEFT JOIN' if optional else 'JOIN'} {table} ON {on}")
    listed = ", ".join(selected + ([also] if also else []))
    return f"SELECT {listed} FROM {' '.join(joins)} WHERE {where}", tuple(ends)
