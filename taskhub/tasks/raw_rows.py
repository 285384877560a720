"""Model instances from the columns of a hand-written statement, as the ORM would have built them.

A fork of two Django internals: what iterating a QuerySet does with a row (each field's database converters, then
Model.from_db) and what select_related leaves behind (the related instance in `_state.fields_cache`, so following
the relation reads nothing). taskhub needs it where one statement both changes and reads rows, which the ORM cannot
express: the delivery job's first claim (services.delivering.first_claim, an UPDATE … RETURNING of three tables).
Written against Django 6.1: tests/test_forks.py fails on another minor version, and checks that instances built so
equal the ORM's and follow their relations without a query.
"""

import functools
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models.base import Model, ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

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
        built.append(_from_db(model, using.alias, attnames, values))
        start += len(attnames)
    return built


def _from_db(model: type, alias: str, attnames: list[str], values: list):
    """What model.from_db(alias, attnames, values) builds, at a fraction of its cost where nothing can tell them apart:
    its __init__ sets each value through the class's attribute (a plain field's DeferredAttribute and a foreign key's
    ForeignKeyDeferredAttribute store it in the instance's __dict__, as here) and sends pre_init and post_init (none
    listens: otherwise from_db builds it). from_db of a model read in part (only) also walks every field for each of
    those read: a task's nine columns cost 14.5 us, a third of a card's statement (bench/pages.py, the inbox)."""
    if not _plainly_stored(model) or pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model.from_db(alias, attnames, values)
    new = model.__new__(model)
    state = new._state = ModelState()
    state.adding = False
    state.db = alias
    new.__dict__.update(zip(attnames, values, strict=True))
    return new


@functools.cache
def _plainly_stored(model: type) -> bool:
    """Whether Django's from_db and __init__ build `model`'s instances (not its own) and every concrete field's value
    is stored by its class attribute in the instance's __dict__ alone."""
    return (
        not model._meta.abstract
        and model.__init__ is Model.__init__
        and model.from_db.__func__ is Model.from_db.__func__
        and all(
            type(model.__dict__.get(field.attname)) in (DeferredAttribute, ForeignKeyDeferredAttribute)
            for field in model._meta.concrete_fields
        )
    )


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
