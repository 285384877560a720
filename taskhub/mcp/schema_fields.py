"""A JSON schema from an MCP server (untrusted) as fields a person fills in, and values checked against it.

One field model, one builder, one validator and one set of messages, for two uses:

- `TOOL`: a tool's `inputSchema`, for launching it (the launch page, the API, `manage.py launch`, the
  CLI's `--args`). Any JSON Schema may come; what the form cannot show makes the whole form
  unrenderable, so the page offers raw JSON instead.
- `ELICITATION`: an elicitation's `requestedSchema`, which MCP restricts to a flat object of primitives
  (string with email/uri/date/date-time formats and lengths, number/integer with bounds, boolean,
  single- and multi-select of strings). An optional field that does not fit is shown as unsupported and
  left out; a required one makes the form unrenderable (the person can only decline or cancel).

`build_fields(schema, use)` never raises. `value_from_form` / `value_from_text` turn what a person typed
(a form post, a terminal line) into a typed value or raise `FieldInputError`; `validate(schema, values,
use)` checks the values with `jsonschema` and one shared format checker. Every message a person sees
about a value comes from here, so the launch form, the answer form, the API and the CLI say the same.

No Django here: taskhub.mcp is imported by the CLI, which runs without it.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from jsonschema import FormatChecker
from referencing.exceptions import Unresolvable

MAX_SCHEMA_CHARS = 200_000
MAX_PROPERTIES = 100
MAX_CHOICES = 500
# A hostile schema can fail on every one of thousands of fields; the first ones are reported.
MAX_ERRORS = 50
MAX_TEXT = 2_000  # labels, help and error texts from the server are cut here
CHOICES_NAMED = 10  # "must be one of …" names this many values, then "…"
SCALAR_TYPES = ("string", "number", "integer", "boolean")
STRING_INPUT_TYPES = {"email": "email", "uri": "url", "url": "url", "date": "date", "date-time": "datetime-local"}
NOT_RENDERABLE_KEYWORDS = ("$ref", "$dynamicRef", "allOf", "not", "if", "then", "else", "dependentSchemas")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
URI_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
# RFC 3339 date-time: seconds and a zone are required (JSON Schema's "date-time").
RFC3339_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
DATETIME_LOCAL = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?$")
YES = ("y", "yes", "true", "1")
NO = ("n", "no", "false", "0")


@dataclass(frozen=True)
class Use:
    """What a schema is for; the differences between the two uses are all here."""

    subject: str  # how messages name the schema
    html_prefix: str  # form input names are this + the property name, so none clashes with the page's own
    restricted: bool  # MCP's elicitation subset: one type, string-only choices, no lists of free text
    lone_unsupported_ok: bool  # an optional field that cannot be shown is left out, not the whole form
    tristate_booleans: bool  # an optional boolean without default may stay unset (yes / no / not set)
    choice_tokens_are_values: bool  # a choice is posted as its value (text), else as its position
    closed: bool  # values may only name the schema's properties


TOOL = Use(
    subject="the tool's input schema",
    html_prefix="arg.",
    restricted=False,
    lone_unsupported_ok=False,
    tristate_booleans=True,
    choice_tokens_are_values=False,
    closed=False,
)
ELICITATION = Use(
    subject="the requested schema",
    html_prefix="f:",
    restricted=True,
    lone_unsupported_ok=True,
    tristate_booleans=False,
    choice_tokens_are_values=True,
    closed=True,
)

# --- messages -----------------------------------------------------------------------------------------

REQUIRED = "this field is required"
NOT_ASKED = "this field was not asked for"
NOT_AN_OBJECT = "the values must be a JSON object of named fields"
TYPE_WORDS = {
    "string": "text",
    "integer": "a whole number",
    "number": "a number",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}
FORMAT_WORDS = {
    "email": "must be an email address like name@example.com",
    "uri": "must be an absolute URI like https://example.com/page",
    "date": "must be a date like 2026-07-28",
    "date-time": "must be a date and time with a time zone and seconds, like 2026-07-28T14:30:00Z",
}


def must_be(kinds: Any, *, choices: bool = False) -> str:
    kinds = kinds if isinstance(kinds, list) else [kinds]
    words = [TYPE_WORDS.get(str(kind), str(kind)[:40]) for kind in kinds]
    if choices:
        words = ["a list of choices" if word == "a list" else word for word in words]
    return "must be " + " or ".join(words)


def _shown(value: Any) -> str:
    return value[:80] if isinstance(value, str) else json.dumps(value)[:80]


def one_of(values: list[Any]) -> str:
    named = ", ".join(_shown(value) for value in values[:CHOICES_NAMED])
    return f"must be one of {named}{', …' if len(values) > CHOICES_NAMED else ''}"


def not_among(value: Any, values: list[Any]) -> str:
    named = ", ".join(_shown(v) for v in values[:CHOICES_NAMED])
    return f"{_shown(value)} not among the choices ({named}{', …' if len(values) > CHOICES_NAMED else ''})"


class FieldInputError(ValueError):
    """What a person typed cannot be read as the field's type; the message is one of the shared ones."""


class _Unrenderable(Exception):
    pass


# --- the field model ------------------------------------------------------------------------------------


@dataclass
class Choice:
    value: Any
    label: str
    token: str  # what a form posts for it (and a terminal accepts besides its number and label)
    selected: bool = False


@dataclass
class SchemaField:
    name: str  # the property name as the server sent it
    index: int
    widget: str  # input, textarea, checkbox, tristate, select, checkboxes, lines, unsupported
    use: Use
    input_type: str = "text"  # for "input": text, email, url, date, datetime-local, number
    label: str = ""
    help: str = ""
    required: bool = False
    default: Any = None
    has_default: bool = False
    choices: list[Choice] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)  # minlength, maxlength, min, max, step
    constraints: list[str] = field(default_factory=list)  # said in words under the field
    schema: dict[str, Any] = field(default_factory=dict)
    problem: str = ""  # for "unsupported": why
    # What a page shows: the default, a value switched from JSON, or the text submitted.
    value: str = ""
    checked: bool = False
    error: str = ""

    @property
    def html_name(self) -> str:
        return self.use.html_prefix + self.name

    @property
    def html_id(self) -> str:
        return f"arg-{self.index}"

    @property
    def placeholder(self) -> bool:
        """A select starts on an empty option unless a required field has a default."""
        return not self.required or not self.has_default

    @property
    def kind(self) -> str | None:
        kind = self.schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), None)
        return kind if isinstance(kind, str) else None

    def show(self, value: Any) -> None:
        """Show `value` (a typed value) in the field; a value that does not fit is left out."""
        self.value, self.checked = "", False
        for choice in self.choices:
            choice.selected = False
        if self.widget == "checkbox":
            self.checked = value is True
        elif self.widget in ("tristate", "select"):
            for choice in self.choices:
                choice.selected = _same(choice.value, value)
        elif self.widget == "checkboxes":
            values = value if isinstance(value, list) else []
            for choice in self.choices:
                choice.selected = any(_same(choice.value, v) for v in values)
        elif self.widget == "lines":
            if isinstance(value, list):
                self.value = "\n".join(str(item) for item in value if _is_scalar(item) and item is not None)
        elif value is None or isinstance(value, dict | list | bool):
            self.value = ""
        elif self.input_type == "number" and not isinstance(value, int | float):
            self.value = ""  # a default of the wrong type is not shown
        elif self.input_type == "datetime-local" and isinstance(value, str):
            self.value = _datetime_local(value)
        elif isinstance(value, float) and value.is_integer():
            self.value = str(int(value))
        else:
            self.value = str(value)

    def show_submitted(self, raw: str | list[str] | None) -> None:
        """Show what was posted, as posted (a refused form is shown again with the person's input)."""
        tokens = set(raw) if isinstance(raw, list) else {raw or ""}
        if self.widget == "checkbox":
            self.checked = raw is not None
        elif self.widget in ("tristate", "select", "checkboxes"):
            for choice in self.choices:
                choice.selected = choice.token in tokens
        elif self.widget != "unsupported":
            self.value = raw if isinstance(raw, str) else ""


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return MAX_SCHEMA_CHARS + 1


@dataclass
class FieldSet:
    fields: list[SchemaField]
    renderable: bool
    problem: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def answerable_fields(self) -> list[SchemaField]:
        return [f for f in self.fields if f.widget != "unsupported"]

    @property
    def has_required(self) -> bool:
        return any(f.required for f in self.fields)


# --- schema → fields -------------------------------------------------------------------------------------


def build_fields(schema: Any, use: Use) -> FieldSet:
    """The fields of `schema`, showing their defaults; never raises, whatever the schema is."""
    try:
        return _build(schema, use)
    except _Unrenderable as reason:
        return FieldSet(fields=[], renderable=False, problem=str(reason), defaults=_safe_defaults(schema))
    except Exception:  # a shape nobody thought of: still never a crash
        return FieldSet(fields=[], renderable=False, problem=f"{_cap(use.subject)} has a shape this form cannot show.")


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def defaults_of(schema: Any) -> dict[str, Any]:
    """Each property's `default`, for pre-filling a JSON box too."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return {}
    return {
        str(name): prop["default"]
        for name, prop in list(schema["properties"].items())[:MAX_PROPERTIES]
        if isinstance(prop, dict) and "default" in prop and _json_size(prop["default"]) <= MAX_SCHEMA_CHARS
    }


def _safe_defaults(schema: Any) -> dict[str, Any]:
    try:
        return defaults_of(schema)
    except Exception:
        return {}


def _ordered(properties: dict, required: list[str]) -> list[str]:
    """Required fields in the order `required` lists them, then the others by name.

    The server's order of `properties` is lost once stored (Postgres jsonb orders object keys by length),
    while `required` is a list and keeps its order; names sort predictably.
    """
    first = list(dict.fromkeys(required))
    return first + sorted((name for name in properties if name not in first), key=lambda name: str(name).lower())


def _build(schema: Any, use: Use) -> FieldSet:
    subject = _cap(use.subject)
    if schema is None and not use.restricted:
        schema = {"type": "object"}  # a tool without arguments (an elicitation must send its schema)
    if not isinstance(schema, dict):
        raise _Unrenderable(f"{subject} is not a JSON object.")
    if _json_size(schema) > MAX_SCHEMA_CHARS:
        raise _Unrenderable(f"{subject} is too large to show as a form.")
    if schema.get("type", "object") != "object":
        raise _Unrenderable(f"{subject} does not describe an object of named fields.")
    for keyword in (*NOT_RENDERABLE_KEYWORDS, "anyOf", "oneOf"):
        if keyword in schema:
            raise _Unrenderable(f"{subject} uses {keyword}, which this form cannot show.")
    properties = schema.get("properties")
    properties = {} if properties is None else properties
    if not isinstance(properties, dict):
        raise _Unrenderable(f"{subject}'s properties are not a JSON object.")
    if len(properties) > MAX_PROPERTIES:
        raise _Unrenderable(f"{subject} has more than {MAX_PROPERTIES} properties.")
    required = schema.get("required")
    required = [] if required is None else required
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise _Unrenderable(f"{subject}'s required list is not a list of names.")
    missing = [name for name in required if name not in properties]
    if missing:
        raise _Unrenderable(f"{subject} requires {missing[0][:80]!r} but does not describe it.")
    fields, problems = [], []
    for index, name in enumerate(_ordered(properties, required)):
        prop, is_required = properties[name], name in required
        try:
            fields.append(_field(str(name), prop, is_required, index, use))
        except _Unrenderable as why:
            if is_required or not use.lone_unsupported_ok:
                problems.append(str(why))
            label = (_text(prop.get("title")) if isinstance(prop, dict) else "") or str(name)
            unsupported = SchemaField(name=str(name), index=index, widget="unsupported", use=use, label=label)
            unsupported.required, unsupported.problem = is_required, str(why)
            fields.append(unsupported)
    if problems:
        return FieldSet(fields=[], renderable=False, problem=" ".join(problems), defaults=defaults_of(schema))
    field_set = FieldSet(fields=fields, renderable=True, defaults=defaults_of(schema))
    for form_field in field_set.answerable_fields:
        form_field.show(form_field.default if form_field.has_default else None)
    return field_set


def _single_type(schema: dict[str, Any], name: str, use: Use) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(others) != 1 or use.restricted:
            raise _Unrenderable(f"The property {name!r} allows several types.")
        kind = others[0]
    if kind is not None and not isinstance(kind, str):
        raise _Unrenderable(f"The property {name!r}'s type is not a name.")
    return kind


def _choices_of(schema: dict[str, Any], name: str, use: Use) -> list[Choice] | None:
    """enum (with legacy enumNames) or oneOf/anyOf of {const, title}; None when neither."""
    values: list[Any]
    titles: list[Any]
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise _Unrenderable(f"The property {name!r} has an enum that is not a non-empty list.")
        names = schema.get("enumNames")
        titles = names if isinstance(names, list) and len(names) == len(values) else [None] * len(values)
    else:
        keyword = next((k for k in ("oneOf", "anyOf") if k in schema), None)
        if keyword is None:
            return None
        options = schema[keyword]
        if not (isinstance(options, list) and options and all(isinstance(o, dict) and "const" in o for o in options)):
            raise _Unrenderable(f"The property {name!r} uses {keyword} with options that are not simple values.")
        values, titles = [o["const"] for o in options], [o.get("title") for o in options]
    if len(values) > MAX_CHOICES:
        raise _Unrenderable(f"The property {name!r} offers more than {MAX_CHOICES} values.")
    if use.restricted and not all(isinstance(value, str) for value in values):
        raise _Unrenderable(f"The property {name!r} offers values that are not text.")
    if not all(_is_scalar(value) for value in values):
        raise _Unrenderable(f"The property {name!r} offers values that are not plain text, numbers or booleans.")
    by_value = use.choice_tokens_are_values and len(set(values)) == len(values)
    return [
        Choice(value=value, label=_text(title) or _choice_label(value), token=value if by_value else str(i))
        for i, (value, title) in enumerate(zip(values, titles, strict=True))
    ]


def _choice_label(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else json.dumps(value)


def _field(name: str, prop: Any, required: bool, index: int, use: Use) -> SchemaField:
    if not isinstance(prop, dict):
        raise _Unrenderable(f"The property {name!r} is not described by a JSON object.")
    for keyword in NOT_RENDERABLE_KEYWORDS:
        if keyword in prop:
            raise _Unrenderable(f"The property {name!r} uses {keyword}, which this form cannot show.")
    kind = _single_type(prop, name, use)
    form_field = SchemaField(
        name=name,
        index=index,
        widget="input",
        use=use,
        label=_text(prop.get("title")) or name,
        help=_text(prop.get("description")),
        required=required,
        default=prop.get("default"),
        has_default="default" in prop,
        schema=prop,
    )
    if kind is None and (use.restricted or not any(k in prop for k in ("enum", "oneOf", "anyOf"))):
        raise _Unrenderable(f"The property {name!r} has no type.")
    choices = _choices_of(prop, name, use)
    if choices is not None:
        if kind not in ((None, "string") if use.restricted else (None, *SCALAR_TYPES)):
            raise _Unrenderable(f"The property {name!r} is a choice of {kind}, which this form cannot show.")
        form_field.widget, form_field.choices = "select", choices
        return form_field
    if kind == "string":
        return _string_field(form_field, prop)
    if kind in ("number", "integer"):
        return _number_field(form_field, prop, kind)
    if kind == "boolean":
        tristate = use.tristate_booleans and not required and not form_field.has_default
        form_field.widget = "tristate" if tristate else "checkbox"
        if tristate:
            form_field.choices = [Choice(True, "Yes", "1"), Choice(False, "No", "0")]
        return form_field
    if kind == "array":
        return _array_field(form_field, prop, use)
    raise _Unrenderable(f"The property {name!r} is of type {_text(kind)[:40]}, which this form cannot show.")


def _bound(prop: dict[str, Any], key: str, name: str, *, whole: bool = False) -> int | float | None:
    """A numeric keyword's value; a value of the wrong kind makes the field unrenderable."""
    value = prop.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _Unrenderable(f"The property {name!r} has a {key} that is not a number.")
    if whole:
        if value < 0 or not float(value).is_integer():
            raise _Unrenderable(f"The property {name!r} has a {key} that is not a whole number.")
        return int(value)
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _string_field(form_field: SchemaField, prop: dict[str, Any]) -> SchemaField:
    name = form_field.name
    fmt = prop.get("format")
    form_field.input_type = STRING_INPUT_TYPES.get(fmt, "text") if isinstance(fmt, str) else "text"
    shortest, longest = _bound(prop, "minLength", name, whole=True), _bound(prop, "maxLength", name, whole=True)
    if form_field.input_type == "datetime-local":
        form_field.attrs["step"] = "1"
        form_field.constraints.append("Date and time in UTC.")
        return form_field  # the browser's picker gives the format; lengths would only get in its way
    if form_field.input_type == "date":
        return form_field
    if isinstance(fmt, str) and fmt and form_field.input_type == "text":
        form_field.constraints.append(f"Format: {_text(fmt)[:80]}.")
    if shortest:
        form_field.attrs["minlength"] = str(shortest)
        form_field.constraints.append(f"At least {shortest} characters.")
    if longest is not None:
        form_field.attrs["maxlength"] = str(longest)
        form_field.constraints.append(f"At most {longest} characters.")
    pattern = prop.get("pattern")
    if isinstance(pattern, str) and pattern:
        form_field.constraints.append(f"Pattern: {pattern[:200]}")
    if longest is not None and longest > 200 and form_field.input_type == "text":
        form_field.widget = "textarea"
    return form_field


def _number_field(form_field: SchemaField, prop: dict[str, Any], kind: str) -> SchemaField:
    name = form_field.name
    form_field.input_type = "number"
    form_field.attrs["step"] = "1" if kind == "integer" else "any"
    step = _bound(prop, "multipleOf", name)
    if step and step > 0:
        form_field.attrs["step"] = str(step)
        form_field.constraints.append(f"A multiple of {step}.")
    for key, attr, words in (
        ("minimum", "min", "At least {}."),
        ("maximum", "max", "At most {}."),
        ("exclusiveMinimum", None, "More than {}."),
        ("exclusiveMaximum", None, "Less than {}."),
    ):
        bound = _bound(prop, key, name)
        if bound is not None:
            if attr:
                form_field.attrs[attr] = str(bound)
            form_field.constraints.append(words.format(bound))
    if kind == "integer":
        form_field.constraints.insert(0, "A whole number.")
    return form_field


def _array_field(form_field: SchemaField, prop: dict[str, Any], use: Use) -> SchemaField:
    name = form_field.name
    items = prop.get("items")
    if not isinstance(items, dict):
        raise _Unrenderable(f"The list {name!r} does not describe its items.")
    for keyword in NOT_RENDERABLE_KEYWORDS:
        if keyword in items:
            raise _Unrenderable(f"The list {name!r} uses {keyword} for its items.")
    fewest, most = _bound(prop, "minItems", name, whole=True), _bound(prop, "maxItems", name, whole=True)
    choices = _choices_of(items, name, use)
    if choices is not None:
        form_field.widget, form_field.choices = "checkboxes", choices
        if fewest:
            form_field.constraints.append(f"Pick at least {fewest}.")
        if most is not None:
            form_field.constraints.append(f"Pick at most {most}.")
        return form_field
    if not use.restricted and _single_type(items, name, use) == "string" and not items.get("format"):
        form_field.widget = "lines"
        form_field.constraints.append("One per line.")
        if fewest:
            form_field.constraints.append(f"At least {fewest}.")
        if most is not None:
            form_field.constraints.append(f"At most {most}.")
        return form_field
    raise _Unrenderable(f"The list {name!r} holds items this form cannot show.")


# --- what a person typed → typed values -----------------------------------------------------------------

OMIT = object()  # "leave this field out of the values"


def parse_number(text: str, *, integer: bool) -> int | float:
    """A number typed by a person: `4.0` for a whole number is 4, `2.5` is not one."""
    cleaned = text.strip().replace("\u2212", "-")
    message = "must be " + TYPE_WORDS["integer" if integer else "number"]
    try:
        return int(cleaned)
    except ValueError:
        pass
    try:
        number = float(cleaned)
    except ValueError:
        raise FieldInputError(message) from None
    if not math.isfinite(number) or (integer and not number.is_integer()):
        raise FieldInputError(message)
    return int(number) if integer else number


def _datetime_local(value: str) -> str:
    """An RFC 3339 date-time as the UTC "YYYY-MM-DDTHH:MM:SS" a datetime-local input shows."""
    try:
        moment = datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return ""
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def with_zone(text: str) -> str:
    """A date and time typed without a zone (what a datetime-local input sends) is UTC, as the form says;
    anything else is left as typed for the validator to judge."""
    if not DATETIME_LOCAL.match(text):
        return text
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        return text
    return moment.replace(tzinfo=datetime.UTC).isoformat().replace("+00:00", "Z")


def _by_token(form_field: SchemaField, token: str) -> Choice | None:
    return next((choice for choice in form_field.choices if choice.token == token), None)


def value_from_form(form_field: SchemaField, raw: str | list[str] | None) -> Any:
    """The typed value of what a form posted for the field (`raw`: its value, its values for checkboxes, or
    None when absent); OMIT to leave it out. Checking it against the schema is `validate`'s job."""
    widget = form_field.widget
    if widget == "checkbox":
        return raw is not None
    values = [choice.value for choice in form_field.choices]
    if widget == "checkboxes":
        tokens = [token for token in raw if token != ""] if isinstance(raw, list) else []
        unknown = next((token for token in tokens if _by_token(form_field, token) is None), None)
        if unknown is not None:
            raise FieldInputError(not_among(unknown, values))
        picked = [choice.value for choice in form_field.choices if choice.token in tokens]
        return picked if picked or form_field.required else OMIT
    text = raw if isinstance(raw, str) else ""
    if widget in ("tristate", "select"):
        if text == "":
            return OMIT
        chosen = _by_token(form_field, text)
        if chosen is None:
            raise FieldInputError(one_of(values))
        return chosen.value
    if widget == "lines":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines if lines or form_field.required else OMIT
    if widget == "unsupported":
        return OMIT
    return _scalar_from_text(form_field, text)


def _scalar_from_text(form_field: SchemaField, text: str) -> Any:
    if form_field.input_type != "text":
        text = text.strip()
    if text == "":
        return OMIT
    if form_field.input_type == "number":
        return parse_number(text, integer=form_field.kind == "integer")
    if form_field.input_type == "datetime-local":
        return with_zone(text)
    return text


def value_from_text(form_field: SchemaField, text: str) -> Any:
    """The typed value of one line a person typed on a terminal; OMIT to leave the field out.

    Booleans are yes/no; a choice is its number in the list, its value or its title; several choices are
    separated by commas. An empty line takes the default, if any.
    """
    text = text.strip()
    widget = form_field.widget
    if text == "":
        if form_field.has_default:
            return form_field.default
        return [] if widget == "checkboxes" and form_field.required else OMIT
    if widget in ("checkbox", "tristate"):
        if text.lower() in YES:
            return True
        if text.lower() in NO:
            return False
        raise FieldInputError(must_be("boolean"))
    if widget == "select":
        return _choose(form_field, text, one_of)
    if widget == "checkboxes":
        parts = [part.strip() for part in text.split(",") if part.strip()]
        return [_choose(form_field, part, lambda values, part=part: not_among(part, values)) for part in parts]
    if widget == "lines":
        return [part.strip() for part in text.split(",") if part.strip()]
    if widget == "unsupported":
        return OMIT
    return _scalar_from_text(form_field, text)


def _choose(form_field: SchemaField, text: str, refusal) -> Any:
    choices = form_field.choices
    if text.isdigit() and 1 <= int(text) <= len(choices):
        return choices[int(text) - 1].value
    for choice in choices:
        if text in (choice.token, choice.label) or (isinstance(choice.value, str) and text == choice.value):
            return choice.value
    raise FieldInputError(refusal([choice.value for choice in choices]))


# --- checking values ------------------------------------------------------------------------------------

FORMAT_CHECKER = FormatChecker(formats=())


@FORMAT_CHECKER.checks("email")
def is_email(value: object) -> bool:
    return not isinstance(value, str) or bool(EMAIL.match(value))


@FORMAT_CHECKER.checks("uri")
def is_uri(value: object) -> bool:
    """An absolute URI (RFC 3986): a scheme, then something, and no spaces or control characters."""
    if not isinstance(value, str):
        return True
    scheme = URI_SCHEME.match(value)
    return bool(scheme) and len(value) > scheme.end() and not re.search(r"[\s\x00-\x1f\x7f]", value)


@FORMAT_CHECKER.checks("date")
def is_date(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


@FORMAT_CHECKER.checks("date-time")
def is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not RFC3339_DATETIME.match(value):
        return False
    try:
        datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00").replace("t", "T"))
    except ValueError:
        return False
    return True


def _choice_values(schema: Any) -> list[Any] | None:
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list):
        return schema["enum"]
    for keyword in ("oneOf", "anyOf"):
        options = schema.get(keyword)
        if isinstance(options, list) and options and all(isinstance(o, dict) and "const" in o for o in options):
            return [o["const"] for o in options]
    return None


def describe(error: jsonschema.ValidationError) -> str:
    """One validation error in the words every front shows."""
    keyword, value = error.validator, error.validator_value
    in_list = len(error.path) >= 1 and isinstance(error.path[-1], int)
    match keyword:
        case "type":
            items = error.schema.get("items") if isinstance(error.schema, dict) else None
            return must_be(value, choices=_choice_values(items) is not None)
        case "enum" | "oneOf" | "anyOf" | "const" if (choices := _choice_values(error.schema)) is not None:
            return not_among(error.instance, choices) if in_list else one_of(choices)
        case "const":
            return one_of([value])
        case "minLength":
            return f"must be at least {value} characters long"
        case "maxLength":
            return f"must be at most {value} characters long"
        case "minimum":
            return f"must be at least {value}"
        case "maximum":
            return f"must be at most {value}"
        case "exclusiveMinimum":
            return f"must be more than {value}"
        case "exclusiveMaximum":
            return f"must be less than {value}"
        case "multipleOf":
            return f"must be a multiple of {value}"
        case "pattern":
            return f"must match the pattern {str(value)[:200]}"
        case "format":
            return FORMAT_WORDS.get(value, f"must be a valid {str(value)[:80]}")
        case "minItems":
            return f"pick at least {value}"
        case "maxItems":
            return f"pick at most {value}"
        case "uniqueItems":
            return "each choice may be picked once"
        case "required":
            return REQUIRED
    return error.message[:MAX_TEXT]


def validate(schema: Any, values: Any, use: Use) -> dict[str, str]:
    """Errors keyed by top-level field ("" for the values as a whole); empty when the values fit."""
    subject = _cap(use.subject)
    if not isinstance(values, dict):
        return {"": NOT_AN_OBJECT}
    if schema is None:
        return {}
    if not isinstance(schema, dict):
        return {"": f"{subject} is not a JSON object, so the values cannot be checked."}
    if _json_size(schema) > MAX_SCHEMA_CHARS:
        return {"": f"{subject} is too large to check the values against."}
    errors: dict[str, str] = {}
    if use.closed:
        properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        errors.update({str(name): NOT_ASKED for name in values if name not in properties})
    if use.restricted:
        schema = _as_sets(schema)
    try:
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        problem = _schema_problem(validator_class, schema)
        if problem is not None:
            return {"": f"{subject} is not valid JSON Schema (server says: {problem})."}
        validator = validator_class(schema, format_checker=FORMAT_CHECKER)
        for error in sorted(validator.iter_errors(values), key=lambda e: [str(p) for p in e.path]):
            if len(errors) >= MAX_ERRORS:
                break
            if not error.path and error.validator == "required":
                for name in error.validator_value:
                    if name not in values:
                        errors.setdefault(str(name), REQUIRED)
                continue
            if not error.path and error.validator == "additionalProperties":
                extra = [name for name in values if name not in (schema.get("properties") or {})]
                errors.update({str(name): NOT_ASKED for name in extra or [""]})
                continue
            key = str(error.path[0]) if error.path else ""
            message = describe(error)
            nested = [str(part) for part in list(error.path)[1:] if not isinstance(part, int)]
            errors.setdefault(key, f"{'.'.join(nested)}: {message}" if nested else message)
        return dict(list(errors.items())[:MAX_ERRORS])
    except jsonschema.SchemaError as error:
        return {"": f"{subject} is not valid JSON Schema (server says: {error.message[:300]})."}
    except Unresolvable:
        return {"": f"{subject} refers to another schema ($ref) that taskhub cannot resolve."}
    except Exception as error:  # a pathological schema…
        return {"": f"The values could not be checked against {use.subject} ({type(error).__name__})."}


# What checking a schema against its metaschema said, by the schema's exact JSON text (its digest): that check was
# most of a validation's time (about 10 ms for a form of a dozen fields, on every answer sent and every launch), and
# servers ask the same forms again and again. Emptied when full; a schema checked again is checked anew.
SCHEMA_CHECKS_KEPT = 512
_schema_checks: dict[tuple[type, bytes], str | None] = {}
_NOT_CHECKED = object()


def _schema_problem(validator_class: type, schema: dict[str, Any]) -> str | None:
    """Why `schema` is not valid JSON Schema for `validator_class` (the metaschema's message), or None."""
    key = (validator_class, hashlib.sha256(json.dumps(schema).encode()).digest())
    known = _schema_checks.get(key, _NOT_CHECKED)
    if known is not _NOT_CHECKED:
        return known
    try:
        validator_class.check_schema(schema)
        problem = None
    except jsonschema.SchemaError as error:
        problem = error.message[:300]
    if len(_schema_checks) >= SCHEMA_CHECKS_KEPT:
        _schema_checks.clear()
    _schema_checks[key] = problem
    return problem


def _as_sets(schema: dict[str, Any]) -> dict[str, Any]:
    """An elicitation's multi-selects pick each choice once (a form cannot pick one twice), `uniqueItems` or not."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return schema
    sets = {
        name: {"uniqueItems": True, **prop}
        for name, prop in properties.items()
        if isinstance(prop, dict) and prop.get("type") == "array" and _choice_values(prop.get("items")) is not None
    }
    return {**schema, "properties": {**properties, **sets}} if sets else schema


def field_error(form_field: SchemaField, value: Any) -> str:
    """What is wrong with one field's value ("" when nothing), as `validate` would say it."""
    schema = {"type": "object", "properties": {form_field.name: form_field.schema}}
    return validate(schema, {form_field.name: value}, form_field.use).get(form_field.name, "")


def read_form(field_set: FieldSet, post) -> tuple[dict[str, Any], dict[str, str]]:
    """Typed values from a form post (anything with `get` and `getlist`), and the fields that could not be read."""
    values: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for form_field in field_set.answerable_fields:
        name = form_field.html_name
        raw = post.getlist(name) if form_field.widget == "checkboxes" else post.get(name)
        form_field.show_submitted(raw)
        try:
            value = value_from_form(form_field, raw)
        except FieldInputError as error:
            problems[form_field.name] = str(error)
            continue
        if value is not OMIT:
            values[form_field.name] = value
    return values, problems


def messages_of(errors: dict[str, str]) -> str:
    """Errors as one line: `name: message; …`."""
    return "; ".join(f"{name}: {message}" if name else message for name, message in errors.items())
