"""Model instances read from the database, built as Model.from_db builds them at a fraction of its cost.

Django's from_db calls the model's __init__, which sends pre_init and post_init, sets every value through the
class's attribute, and for a model read in part (only(), defer()) first walks every field for each value read: each of
a list page's 50 tasks took 19 us, each of their servers 10 us (bench/pages.py's database, in-process: a tenth of the
page's CPU), against about 2 us here. Where nothing can tell the two apart (no receiver of either signal; every
field's class attribute Django's own, which stores the value in the instance's __dict__; neither __init__ nor from_db
the model's own), the values go straight into the instance's __dict__ and its state is set as from_db sets it.
Otherwise Django builds it.

A model takes it by listing LoadedPlainly before models.Model among its bases (Django's documented hook: "Customizing
model loading"): the ORM's reads then build its instances so, and taskhub.tasks.raw_rows builds any model's so.
Written against Django 6.1 (tests/test_forks.py fails on another minor version and compares both ways' instances).
"""

import functools

from django.db.models import DEFERRED, Model
from django.db.models.base import ModelState
from django.db.models.fields.related_descriptors import ForeignKeyDeferredAttribute
from django.db.models.query_utils import DeferredAttribute
from django.db.models.signals import post_init, pre_init

FORKED_FROM_DJANGO = (6, 1)
_DJANGOS_FROM_DB = Model.from_db.__func__


def from_db(model: type, db: str, field_names, values, *, fetch_mode=None):
    """What `model.from_db(db, field_names, values, fetch_mode=fetch_mode)` returns (Django's, not an override)."""
    if not plainly_stored(model) or pre_init.has_listeners(model) or post_init.has_listeners(model):
        return _DJANGOS_FROM_DB(model, db, field_names, values, fetch_mode=fetch_mode)
    new = model.__new__(model)
    state = new._state = ModelState()
    state.adding = False
    state.db = db
    if fetch_mode is not None:
        state.fetch_mode = fetch_mode
    if len(values) == len(model._meta.concrete_fields):  # from_db then reads them as every field's, in order
        field_names = _attnames(model)
    stored = new.__dict__
    for name, value in zip(field_names, values, strict=True):
        if value is not DEFERRED:
            stored[name] = value
    return new


@functools.cache
def _attnames(model: type) -> tuple[str, ...]:
    return tuple(field.attname for field in model._meta.concrete_fields)


@functools.cache
def plainly_stored(model: type) -> bool:
    """Whether Django's __init__ and from_db build `model`'s instances (none of its own) and every concrete field's
    value is stored by its class attribute in the instance's __dict__ alone."""
    return (
        not model._meta.abstract
        and model.__init__ is Model.__init__
        and getattr(model.from_db, "__func__", None) in (_DJANGOS_FROM_DB, LoadedPlainly.from_db.__func__)
        and model.__setattr__ is Model.__setattr__
        and all(
            type(model.__dict__.get(field.attname)) in (DeferredAttribute, ForeignKeyDeferredAttribute)
            for field in model._meta.concrete_fields
        )
    )


class LoadedPlainly:
    """A model's reads build its instances with `from_db` above (list it before models.Model among the bases)."""

    @classmethod
    def from_db(cls, db, field_names, values, *, fetch_mode=None):
        return from_db(cls, db, field_names, values, fetch_mode=fetch_mode)
