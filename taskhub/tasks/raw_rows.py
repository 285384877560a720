"""Model instances from the columns of a hand-written statement, as the ORM would have built them.

A fork of two Django internals: what iterating a QuerySet does with a row (each field's database converters, then
Model.from_db) and what select_related leaves behind (the related instance in `_state.fields_cache`, so following
the relation reads nothing). taskhub needs it where one statement both changes and reads rows, which the ORM cannot
express: the delivery job's first claim (services.delivering.first_claim, an UPDATE … RETURNING of three tables).
Written against Django 6.1: tests/test_forks.py fails on another minor version, and checks that instances built so
equal the ORM's and follow their relations without a query.
"""

from collections.abc import Sequence
from typing import Any

from django.db import connection

FORKED_FROM_DJANGO = (6, 1)


def columns(alias: str, model: type) -> list[str]:
    """`alias."column"` for each concrete field of `model`, in the order instances() reads them."""
    return [f'{alias}."{field.column}"' for field in model._meta.concrete_fields]


def instances(row: Sequence[Any], models: Sequence[type]) -> list:
    """One instance per model from a row holding each model's concrete columns in turn (columns()), converted as the
    ORM converts them (JSON, encrypted fields)."""
    built, start = [], 0
    for model in models:
        fields = model._meta.concrete_fields
        values = []
        for field, value in zip(fields, row[start : start + len(fields)], strict=True):
            for converter in field.get_db_converters(connection):
                value = converter(value, None, connection)
            values.append(value)
        built.append(model.from_db(connection.alias, [field.attname for field in fields], values))
        start += len(fields)
    return built


def relate(instance, field_name: str, related) -> None:
    """`instance.<field_name>` is `related` from now on, read from nothing (as select_related leaves it)."""
    instance._state.fields_cache[field_name] = related
