"""A JSON schema as an HTML form: the launch form (a tool's inputSchema) and the answer form (an
elicitation's requestedSchema). Fields, conversion, validation and messages are taskhub.mcp.schema_fields';
this binds them to a page: what was posted, what is shown again, which error goes next to which field.

Nothing here marks text safe: labels, help and choices are plain strings the templates escape.
"""

from __future__ import annotations

import json
from typing import Any

from django.utils.translation import gettext_lazy as _

from taskhub.mcp.schema_fields import ELICITATION, TOOL, FieldSet, SchemaField, Use, build_fields, read_form

CANNOT_RENDER = _("taskhub cannot render this request; decline or cancel it.")


class SchemaForm:
    def __init__(self, schema: Any, use: Use):
        self.schema = schema
        self.use = use
        self._fields: FieldSet = build_fields(schema, use)

    @property
    def fields(self) -> list[SchemaField]:
        return self._fields.fields

    @property
    def answerable_fields(self) -> list[SchemaField]:
        return self._fields.answerable_fields

    @property
    def renderable(self) -> bool:
        return self._fields.renderable

    @property
    def problem(self) -> str:
        return self._fields.problem

    @property
    def defaults(self) -> dict[str, Any]:
        return self._fields.defaults

    @property
    def has_required(self) -> bool:
        return self._fields.has_required

    @property
    def shown(self) -> tuple:
        """What a page shows of the form, as one hashable value: its schema, as JSON (the fields, their labels,
        choices and defaults are built from it, build_fields), and what was put in its fields since: the values
        shown (show), the input posted (read) and the errors. A kept card is kept under it (taskhub_rows)."""
        put_in = tuple(
            (field.value, field.checked, field.error, tuple(choice.selected for choice in field.choices))
            for field in self.fields
        )
        return json.dumps(self.schema), put_in

    @property
    def has_errors(self) -> bool:
        return any(form_field.error for form_field in self.fields)

    def read(self, post) -> tuple[dict[str, Any], dict[str, str]]:
        """Typed values from a POST of this form, and the fields whose text could not be read (shown on them).

        The fields show what was posted, as posted."""
        if not self.renderable:
            return {}, {}
        values, problems = read_form(self._fields, post)
        for form_field in self.fields:
            form_field.error = problems.get(form_field.name, "")
        return values, problems

    def show(self, values: dict[str, Any]) -> None:
        for form_field in self.answerable_fields:
            form_field.show(values.get(form_field.name))

    def clear_errors(self) -> None:
        for form_field in self.fields:
            form_field.error = ""

    def set_errors(self, errors: dict[str, str]) -> str:
        """Put errors next to their fields (a field keeps its own first); returns the rest, as one line."""
        by_name = {form_field.name: form_field for form_field in self.answerable_fields}
        rest = []
        for name, message in errors.items():
            if name in by_name:
                by_name[name].error = by_name[name].error or message
            else:
                rest.append(f"{name}: {message}" if name else message)
        return "; ".join(rest)


def launch_form(schema: Any) -> SchemaForm:
    """The launch form of a tool's inputSchema; `renderable` False (with `problem`) means JSON only."""
    return SchemaForm(schema, TOOL)


def answer_form(schema: Any, *, submitted=None, errors: dict[str, str] | None = None) -> SchemaForm:
    """The answer form of an elicitation's requestedSchema; `submitted` (the POST) and `errors` show a refused
    answer again with the person's input."""
    form = SchemaForm(schema, ELICITATION)
    if submitted is not None:
        form.read(submitted)
    if errors:
        form.clear_errors()
        form.set_errors(errors)
    return form
