"""Form-mode elicitation: a `requestedSchema` (from an MCP server, so untrusted and maybe odd) to HTML form fields,
and a submitted form back to the `content` of an ElicitResult.

Supported (MCP 2026-07-28, flat objects of primitives): string (formats email, uri, date, date-time;
minLength/maxLength), number / integer (minimum/maximum), boolean, single-select (plain `enum`, `oneOf` of
{const, title}, legacy `enumNames`), multi-select (array whose `items` have `enum` or `anyOf`/`oneOf` of
{const, title}; minItems/maxItems), `default`, `required`, `title`, `description`.

Nothing here raises on a strange schema. A schema that is not an object, `properties` that is not an
object, or a *required* field taskhub cannot render makes the whole form `unrenderable` (the card then
offers only Decline / Cancel). An *optional* field taskhub cannot render is shown as such and left out
of the answer. Values are never marked safe: templates escape them.

The browser's checks (required, min/max, types) are a courtesy; the answer is checked again on the
server by taskhub.tasks.answers.validate_response (through services.answer_input).
"""

import datetime
import math
from dataclasses import dataclass, field
from typing import Any

CANNOT_RENDER = "taskhub cannot render this request; decline or cancel it."
STRING_FORMATS = {"email": "email", "uri": "url", "date": "date", "date-time": "datetime-local"}
FIELD_PREFIX = "f:"  # form names are FIELD_PREFIX + property name, so no property can clash with ours


@dataclass
class Choice:
    value: str
    label: str
    selected: bool = False


@dataclass
class FormField:
    name: str  # the property name as the server sent it
    index: int
    widget: str  # text | email | url | date | datetime | number | checkbox | select | multi | unsupported
    label: str
    help: str = ""
    required: bool = False
    value: str = ""  # what the input shows (a default, or what the user typed)
    checked: bool = False
    choices: list[Choice] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)  # minlength, maxlength, min, max, step
    error: str = ""
    problem: str = ""  # for widget "unsupported": why
    placeholder: bool = False  # for widget "select": an empty first option (optional choices only)

    @property
    def form_name(self) -> str:
        return FIELD_PREFIX + self.name

    @property
    def input_type(self) -> str:
        return "datetime-local" if self.widget == "datetime" else self.widget


@dataclass
class ElicitationForm:
    fields: list[FormField]
    renderable: bool = True
    problem: str = ""

    @property
    def answerable_fields(self) -> list[FormField]:
        return [f for f in self.fields if f.widget != "unsupported"]


class _Unsupported(Exception):
    pass


# --- schema → form ----------------------------------------------------------------------------------


def build_form(schema: Any, *, submitted=None, errors: dict[str, str] | None = None) -> ElicitationForm:
    """Fields for `schema`, pre-filled with defaults, or with `submitted` (the POST data) when re-shown."""
    errors = errors or {}
    if not isinstance(schema, dict):
        return _unrenderable("the requested schema is not an object")
    properties = schema.get("properties", {})
    if properties is None:
        properties = {}
    if not isinstance(properties, dict):
        return _unrenderable("its list of fields (properties) is not an object")
    required = schema.get("required", [])
    if required is None:
        required = []
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        return _unrenderable("its list of required fields is not a list of names")
    fields = []
    problems = []
    for index, name in enumerate(_ordered(properties, required)):
        prop = properties[name]
        is_required = name in required
        try:
            form_field = _field(name, index, prop, is_required, submitted)
        except _Unsupported as why:
            form_field = FormField(
                name=name,
                index=index,
                widget="unsupported",
                label=_text(prop.get("title")) if isinstance(prop, dict) and prop.get("title") else name,
                required=is_required,
                problem=str(why),
            )
            if is_required:
                problems.append(f"the required field {name!r}: {why}")
        form_field.error = _text(errors.get(name, ""))
        fields.append(form_field)
    if problems:
        return ElicitationForm(fields=fields, renderable=False, problem="; ".join(problems))
    return ElicitationForm(fields=fields)


def _ordered(properties: dict, required: list[str]) -> list[str]:
    """Required fields in the order `required` lists them, then the others by name.

    The server's own order of `properties` is lost once stored (Postgres jsonb orders object keys by
    length), while `required` is a list and keeps its order; names sort predictably.
    """
    first = [name for name in dict.fromkeys(required) if name in properties]
    return first + sorted((name for name in properties if name not in first), key=lambda name: str(name).lower())


def _unrenderable(why: str) -> ElicitationForm:
    return ElicitationForm(fields=[], renderable=False, problem=why)


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else str(value)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bound(prop: dict, key: str, *, whole: bool = False) -> str | None:
    if key not in prop or prop[key] is None:
        return None
    value = prop[key]
    if not _number(value) or (whole and (value < 0 or not float(value).is_integer())):
        raise _Unsupported(f"its {key} is not a {'whole ' if whole else ''}number")
    return _format_number(value)


def _format_number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _field(name: str, index: int, prop: Any, required: bool, submitted) -> FormField:
    if not isinstance(prop, dict):
        raise _Unsupported("its description is not an object")
    kind = prop.get("type")
    label = _text(prop.get("title")) or name
    common = dict(name=name, index=index, label=label, help=_text(prop.get("description")), required=required)
    raw = submitted.get(FIELD_PREFIX + name) if submitted is not None else None
    default = prop.get("default")

    if kind == "string":
        for key in ("minLength", "maxLength"):
            _bound(prop, key, whole=True)
        choices = _single_choices(prop)
        if choices is not None:
            value = raw if submitted is not None else (default if isinstance(default, str) else "")
            for choice in choices:
                choice.selected = choice.value == value
            if required and not any(choice.selected for choice in choices):
                choices[0].selected = True  # a required choice shows its first option, as a native select does
            return FormField(widget="select", choices=choices, placeholder=not required, **common)
        fmt = prop.get("format")
        widget = STRING_FORMATS.get(fmt, "text") if isinstance(fmt, str) else "text"
        widget = "datetime" if widget == "datetime-local" else widget
        attrs = {}
        if (low := _bound(prop, "minLength", whole=True)) is not None:
            attrs["minlength"] = low
        if (high := _bound(prop, "maxLength", whole=True)) is not None:
            attrs["maxlength"] = high
        if widget in ("date", "datetime"):
            attrs = {}  # the browser's picker gives the format; lengths would only get in its way
        if submitted is not None:
            value = raw or ""
        elif isinstance(default, str):
            value = _datetime_local(default) if widget == "datetime" else default
        else:
            value = ""
        return FormField(widget=widget, value=value, attrs=attrs, **common)

    if kind in ("number", "integer"):
        attrs = {"step": "1" if kind == "integer" else "any"}
        if (low := _bound(prop, "minimum")) is not None:
            attrs["min"] = low
        if (high := _bound(prop, "maximum")) is not None:
            attrs["max"] = high
        value = (raw or "") if submitted is not None else (_format_number(default) if _number(default) else "")
        return FormField(widget="number", value=value, attrs=attrs, **common)

    if kind == "boolean":
        checked = (raw is not None) if submitted is not None else (default is True)
        return FormField(widget="checkbox", checked=checked, **common)

    if kind == "array":
        choices = _multi_choices(prop.get("items"))
        attrs = {}
        for key, attr in (("minItems", "min_items"), ("maxItems", "max_items")):
            if (bound := _bound(prop, key, whole=True)) is not None:
                attrs[attr] = bound
        if submitted is not None:
            picked = set(submitted.getlist(FIELD_PREFIX + name)) if hasattr(submitted, "getlist") else set()
        else:
            picked = {item for item in default if isinstance(item, str)} if isinstance(default, list) else set()
        for choice in choices:
            choice.selected = choice.value in picked
        return FormField(widget="multi", choices=choices, attrs=attrs, **common)

    if kind is None:
        raise _Unsupported("it has no type")
    raise _Unsupported(f"its type {_text(kind)[:40]!r} is not one a form can ask for")


def _single_choices(prop: dict) -> list[Choice] | None:
    if "enum" in prop:
        values = prop["enum"]
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise _Unsupported("its choices (enum) are not a list of texts")
        names = prop.get("enumNames")
        if isinstance(names, list) and len(names) == len(values):
            return [Choice(value=v, label=_text(n) or v) for v, n in zip(values, names, strict=True)]
        return [Choice(value=v, label=v) for v in values]
    for key in ("oneOf", "anyOf"):
        if key in prop:
            return _titled_choices(prop[key], key)
    return None


def _titled_choices(options: Any, key: str) -> list[Choice]:
    if not isinstance(options, list) or not options:
        raise _Unsupported(f"its choices ({key}) are not a list")
    choices = []
    for option in options:
        if not isinstance(option, dict) or not isinstance(option.get("const"), str):
            raise _Unsupported(f"a choice in {key} has no text value (const)")
        choices.append(Choice(value=option["const"], label=_text(option.get("title")) or option["const"]))
    return choices


def _multi_choices(items: Any) -> list[Choice]:
    if not isinstance(items, dict):
        raise _Unsupported("it is a list without choices (items)")
    choices = _single_choices(items)
    if choices is None:
        raise _Unsupported("it is a list whose items have no choices (enum or anyOf)")
    return choices


def _datetime_local(value: str) -> str:
    """An ISO date-time with a zone, as the UTC "YYYY-MM-DDTHH:MM[:SS]" a datetime-local input shows."""
    try:
        moment = datetime.datetime.fromisoformat(value)
    except ValueError:
        return ""
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC)
    return moment.replace(tzinfo=None).isoformat(timespec="seconds" if moment.second else "minutes")


# --- form → content ---------------------------------------------------------------------------------


def parse_submission(form: ElicitationForm, data) -> tuple[dict[str, Any], dict[str, str]]:
    """The `content` of an accept, from POST data; plus the fields whose text could not be read (not a number …).

    Types are converted (numbers, booleans, lists); an empty optional field is left out; range, length,
    format and choice checks are left to the validator, which says it in one place.
    """
    content: dict[str, Any] = {}
    problems: dict[str, str] = {}
    for form_field in form.answerable_fields:
        key = form_field.form_name
        if form_field.widget == "checkbox":
            content[form_field.name] = data.get(key) is not None
            continue
        if form_field.widget == "multi":
            picked = [value for value in data.getlist(key) if value != ""]
            if picked or form_field.required:
                content[form_field.name] = picked
            continue
        raw = (data.get(key) or "").strip() if form_field.widget != "text" else data.get(key) or ""
        if raw == "":
            continue
        if form_field.widget == "number":
            number = _parse_number(raw, whole=form_field.attrs.get("step") == "1")
            if number is None:
                problems[form_field.name] = (
                    "must be a whole number" if form_field.attrs.get("step") == "1" else "must be a number"
                )
            else:
                content[form_field.name] = number
        elif form_field.widget == "datetime":
            content[form_field.name] = _with_zone(raw)
        else:
            content[form_field.name] = raw
    return content, problems


def _parse_number(raw: str, *, whole: bool) -> int | float | None:
    text = raw.strip().replace("\u2212", "-")
    try:
        if whole:
            try:
                return int(text)
            except ValueError:
                value = float(text)
                return int(value) if value.is_integer() else value  # 2.5: the validator says "whole number"
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def _with_zone(raw: str) -> str:
    """A datetime-local value ("2026-07-28T14:30") is taken as UTC, as the form says; one with a zone is kept."""
    try:
        moment = datetime.datetime.fromisoformat(raw)
    except ValueError:
        return raw  # the validator explains the expected shape
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.UTC).isoformat().replace("+00:00", "Z")
    return raw
