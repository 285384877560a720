"""A tool's `inputSchema` (JSON Schema, sent by an MCP server: untrusted) as a launch form, and back.

- `build_form(schema)` reads the schema into `ToolForm`: one `FormField` per property it can render
  (strings with formats and lengths, numbers and integers with bounds, booleans, enums with titles,
  arrays of enums as checkboxes, arrays of strings as lines), or `renderable=False` with the reason
  when it cannot (nested objects, `$ref`, mixed `anyOf`, odd shapes), so the page offers raw JSON.
  It never raises, whatever the schema is.
- `ToolForm.arguments_from(post)` turns posted strings into typed arguments, with per-field errors for
  what cannot be converted (a number that is not one); `ToolForm.bind(values)` pre-fills the fields.
- `validate_arguments(schema, arguments)` checks the final arguments with the `jsonschema` library and
  returns errors per top-level property (`""` for the rest), worded for a person.

Nothing here marks text safe: labels, help and choices are plain strings the templates escape.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import jsonschema
from jsonschema import FormatChecker
from referencing.exceptions import Unresolvable

FIELD_PREFIX = "arg."
MAX_SCHEMA_CHARS = 200_000
MAX_PROPERTIES = 100
MAX_CHOICES = 500
# A hostile schema can fail on every one of thousands of fields; the form shows the first ones.
MAX_ERRORS = 50
MAX_TEXT = 2_000  # labels, help and error texts from the server are cut here
SCALAR_TYPES = ("string", "number", "integer", "boolean")
STRING_INPUT_TYPES = {"email": "email", "uri": "url", "url": "url", "date": "date", "date-time": "datetime-local"}
NOT_RENDERABLE_KEYWORDS = ("$ref", "$dynamicRef", "allOf", "not", "if", "then", "else", "dependentSchemas")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


def _text(value: Any) -> str:
    return value[:MAX_TEXT] if isinstance(value, str) else ""


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _json_size(value: Any) -> int:
    try:
        return len(json.dumps(value))
    except (TypeError, ValueError, RecursionError):
        return MAX_SCHEMA_CHARS + 1


@dataclass
class Choice:
    value: Any
    label: str
    index: str


@dataclass
class FormField:
    name: str
    widget: str  # input, checkbox, tristate, select, checkboxes, lines
    input_type: str = "text"  # for widget "input": text, email, url, date, datetime-local, number
    label: str = ""
    help: str = ""
    required: bool = False
    default: Any = None
    has_default: bool = False
    choices: list[Choice] = field(default_factory=list)
    attrs: dict[str, str] = field(default_factory=dict)  # minlength, maxlength, min, max, step
    constraints: list[str] = field(default_factory=list)  # said in words under the field
    schema: dict[str, Any] = field(default_factory=dict)
    index: int = 0
    # What the page shows: the raw submitted text, or the default / a value switched from JSON.
    value: str = ""
    checked: bool = False
    selected: set[str] = field(default_factory=set)
    error: str = ""

    @property
    def html_name(self) -> str:
        return f"{FIELD_PREFIX}{self.name}"

    @property
    def html_id(self) -> str:
        return f"arg-{self.index}"

    def bind_value(self, value: Any) -> None:
        """Show `value` (a typed argument) in the field; values that do not fit are left out."""
        self.value, self.checked, self.selected = "", False, set()
        if self.widget == "checkbox":
            self.checked = value is True
        elif self.widget in ("tristate", "select"):
            self.selected = {choice.index for choice in self.choices if _same(choice.value, value)}
        elif self.widget == "checkboxes":
            values = value if isinstance(value, list) else []
            self.selected = {c.index for c in self.choices if any(_same(c.value, v) for v in values)}
        elif self.widget == "lines":
            if isinstance(value, list):
                self.value = "\n".join(str(item) for item in value if _is_scalar(item) and item is not None)
        elif value is None or isinstance(value, dict | list | bool):
            self.value = ""
        elif self.input_type == "datetime-local" and isinstance(value, str):
            self.value = _datetime_local(value)
        else:
            self.value = str(value)

    def bind_post(self, post) -> None:
        name = self.html_name
        if self.widget == "checkbox":
            self.checked = post.get(name) == "on"
        elif self.widget in ("tristate", "select"):
            self.selected = {post.get(name, "")}
        elif self.widget == "checkboxes":
            self.selected = set(post.getlist(name))
        else:
            self.value = post.get(name, "")

    def convert(self) -> tuple[Any, bool]:
        """(value, present) from what is bound; sets `error` when the text cannot be converted."""
        self.error = ""
        if self.widget == "checkbox":
            return self.checked, True
        if self.widget in ("tristate", "select"):
            chosen = next((choice for choice in self.choices if choice.index in self.selected), None)
            if chosen is None:
                if self.required:
                    self.error = "Choose a value."
                return None, False
            return chosen.value, True
        if self.widget == "checkboxes":
            return [choice.value for choice in self.choices if choice.index in self.selected], bool(
                self.selected or self.required
            )
        if self.widget == "lines":
            lines = [line.strip() for line in self.value.splitlines() if line.strip()]
            if not lines and not self.required:
                return None, False
            return lines, True
        text = self.value.strip() if self.input_type != "text" else self.value
        if text == "":
            if self.required:
                self.error = "This field is required."
            return None, False
        if self.input_type == "number":
            return self._number(text)
        if self.input_type == "datetime-local":
            return _rfc3339(text), True
        return text, True

    def _number(self, text: str) -> tuple[Any, bool]:
        kind = self.schema.get("type")
        try:
            if kind == "integer":
                number: Any = int(text)
            else:
                number = float(text)
                if number != number or number in (float("inf"), float("-inf")):
                    raise ValueError(text)
                if number.is_integer() and re.fullmatch(r"[+-]?\d+", text):
                    number = int(number)
        except ValueError:
            self.error = "Enter a whole number." if kind == "integer" else "Enter a number."
            return None, False
        return number, True


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _datetime_local(value: str) -> str:
    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return ""
    if moment.tzinfo is not None:
        moment = moment.astimezone(datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def _rfc3339(text: str) -> str:
    """A `datetime-local` value (no zone) taken as UTC, as JSON Schema's date-time wants it."""
    try:
        moment = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text  # left for validation to reject with a clear message
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


@dataclass
class ToolForm:
    fields: list[FormField]
    renderable: bool
    reason: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def has_required(self) -> bool:
        return any(form_field.required for form_field in self.fields)

    def bind(self, values: dict[str, Any]) -> None:
        for form_field in self.fields:
            form_field.bind_value(values.get(form_field.name))

    def bind_defaults(self) -> None:
        self.bind(self.defaults)

    def arguments_from(self, post) -> tuple[dict[str, Any], bool]:
        """Typed arguments from a POST of this form; False when some field could not be converted."""
        arguments: dict[str, Any] = {}
        ok = True
        for form_field in self.fields:
            form_field.bind_post(post)
            value, present = form_field.convert()
            if form_field.error:
                ok = False
            elif present:
                arguments[form_field.name] = value
        return arguments, ok

    def set_errors(self, errors: dict[str, str]) -> str:
        """Put errors next to their fields; returns the ones that belong to no field, joined."""
        by_name = {form_field.name: form_field for form_field in self.fields}
        rest = []
        for name, message in errors.items():
            if name in by_name:
                by_name[name].error = by_name[name].error or message
            else:
                rest.append(f"{name}: {message}" if name else message)
        return " ".join(rest)


def defaults_of(schema: Any) -> dict[str, Any]:
    """Each property's `default`, for pre-filling the JSON box too."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return {}
    return {
        str(name): prop["default"]
        for name, prop in list(schema["properties"].items())[:MAX_PROPERTIES]
        if isinstance(prop, dict) and "default" in prop and _json_size(prop["default"]) <= MAX_SCHEMA_CHARS
    }


class _Unrenderable(Exception):
    pass


def build_form(schema: Any) -> ToolForm:
    try:
        return _build(schema)
    except _Unrenderable as reason:
        return ToolForm(fields=[], renderable=False, reason=str(reason), defaults=_safe_defaults(schema))
    except Exception:  # a shape nobody thought of: still never a crash
        return ToolForm(
            fields=[], renderable=False, reason="The input schema has a shape this form cannot show.", defaults={}
        )


def _safe_defaults(schema: Any) -> dict[str, Any]:
    try:
        return defaults_of(schema)
    except Exception:
        return {}


def _build(schema: Any) -> ToolForm:
    if schema is None:
        schema = {"type": "object"}
    if not isinstance(schema, dict):
        raise _Unrenderable("The input schema is not a JSON object.")
    if _json_size(schema) > MAX_SCHEMA_CHARS:
        raise _Unrenderable("The input schema is too large to show as a form.")
    if schema.get("type", "object") != "object":
        raise _Unrenderable("The input schema does not describe an object of named arguments.")
    for keyword in (*NOT_RENDERABLE_KEYWORDS, "anyOf", "oneOf"):
        if keyword in schema:
            raise _Unrenderable(f"The input schema uses {keyword}, which this form cannot show.")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise _Unrenderable("The input schema's properties are not a JSON object.")
    if len(properties) > MAX_PROPERTIES:
        raise _Unrenderable(f"The input schema has more than {MAX_PROPERTIES} properties.")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise _Unrenderable("The input schema's required list is not a list of names.")
    missing = [name for name in required if name not in properties]
    if missing:
        raise _Unrenderable(f"The input schema requires {missing[0]!r} but does not describe it.")
    # Required arguments first: Postgres (jsonb) does not keep the order the server listed them in.
    ordered = sorted(properties.items(), key=lambda item: item[0] not in required)
    fields = [_field(str(name), prop, name in required, index) for index, (name, prop) in enumerate(ordered)]
    form = ToolForm(fields=fields, renderable=True, defaults=defaults_of(schema))
    form.bind_defaults()
    return form


def _choices_of(schema: dict[str, Any]) -> list[Choice] | None:
    """enum (with legacy enumNames) or oneOf/anyOf of {const, title}; None when neither."""
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not values:
            raise _Unrenderable("An enum is not a non-empty list.")
        if len(values) > MAX_CHOICES:
            raise _Unrenderable(f"An enum has more than {MAX_CHOICES} values.")
        if not all(_is_scalar(value) for value in values):
            raise _Unrenderable("An enum offers values that are not plain text, numbers or booleans.")
        names = schema.get("enumNames")
        titles = names if isinstance(names, list) and len(names) == len(values) else [None] * len(values)
        return [
            Choice(value=value, label=_text(title) or _choice_label(value), index=str(i))
            for i, (value, title) in enumerate(zip(values, titles, strict=True))
        ]
    for keyword in ("oneOf", "anyOf"):
        if keyword in schema:
            options = schema[keyword]
            if (
                isinstance(options, list)
                and options
                and len(options) <= MAX_CHOICES
                and all(isinstance(o, dict) and "const" in o and _is_scalar(o["const"]) for o in options)
            ):
                return [
                    Choice(value=o["const"], label=_text(o.get("title")) or _choice_label(o["const"]), index=str(i))
                    for i, o in enumerate(options)
                ]
            raise _Unrenderable(f"A property uses {keyword} with options that are not simple values.")
    return None


def _choice_label(value: Any) -> str:
    if isinstance(value, str):
        return value[:MAX_TEXT]
    return json.dumps(value)


def _single_type(schema: dict[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        others = [k for k in kind if k != "null"]
        if len(others) != 1:
            raise _Unrenderable("A property allows several types.")
        kind = others[0]
    if kind is not None and not isinstance(kind, str):
        raise _Unrenderable("A property's type is not a name.")
    return kind


def _field(name: str, prop: Any, required: bool, index: int) -> FormField:
    if not isinstance(prop, dict):
        raise _Unrenderable(f"The property {name!r} is not described by a JSON object.")
    for keyword in NOT_RENDERABLE_KEYWORDS:
        if keyword in prop:
            raise _Unrenderable(f"The property {name!r} uses {keyword}, which this form cannot show.")
    kind = _single_type(prop)
    form_field = FormField(
        name=name,
        widget="input",
        label=_text(prop.get("title")) or name,
        help=_text(prop.get("description")),
        required=required,
        default=prop.get("default"),
        has_default="default" in prop,
        schema=prop,
        index=index,
    )
    choices = _choices_of(prop)
    if choices is not None:
        if kind not in (None, *SCALAR_TYPES):
            raise _Unrenderable(f"The property {name!r} is an enum of {kind}.")
        form_field.widget = "select"
        form_field.choices = choices
        return form_field
    if kind == "string":
        return _string_field(form_field, prop)
    if kind in ("number", "integer"):
        return _number_field(form_field, prop, kind)
    if kind == "boolean":
        if required or form_field.has_default:
            form_field.widget = "checkbox"
        else:
            form_field.widget = "tristate"
            form_field.choices = [Choice(True, "Yes", "1"), Choice(False, "No", "0")]
        return form_field
    if kind == "array":
        return _array_field(form_field, prop)
    if kind is None:
        raise _Unrenderable(f"The property {name!r} has no type.")
    raise _Unrenderable(f"The property {name!r} is of type {kind}, which this form cannot show.")


def _int_attr(prop: dict[str, Any], key: str) -> int | None:
    value = prop.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _num_attr(prop: dict[str, Any], key: str) -> int | float | None:
    value = prop.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _string_field(form_field: FormField, prop: dict[str, Any]) -> FormField:
    fmt = prop.get("format")
    form_field.input_type = STRING_INPUT_TYPES.get(fmt, "text") if isinstance(fmt, str) else "text"
    if form_field.input_type == "datetime-local":
        form_field.attrs["step"] = "1"
        form_field.constraints.append("Date and time in UTC.")
    elif isinstance(fmt, str) and fmt and form_field.input_type == "text":
        form_field.constraints.append(f"Format: {_text(fmt)[:80]}.")
    shortest, longest = _int_attr(prop, "minLength"), _int_attr(prop, "maxLength")
    if shortest:
        form_field.attrs["minlength"] = str(shortest)
        form_field.constraints.append(f"At least {shortest} characters.")
    if longest is not None:
        form_field.attrs["maxlength"] = str(longest)
        form_field.constraints.append(f"At most {longest} characters.")
    pattern = prop.get("pattern")
    if isinstance(pattern, str) and pattern:
        form_field.constraints.append(f"Pattern: {pattern[:200]}")
    if longest is not None and longest > 200:
        form_field.widget = "textarea"
    return form_field


def _number_field(form_field: FormField, prop: dict[str, Any], kind: str) -> FormField:
    form_field.input_type = "number"
    form_field.attrs["step"] = "1" if kind == "integer" else "any"
    step = _num_attr(prop, "multipleOf")
    if step and step > 0:
        form_field.attrs["step"] = str(step)
        form_field.constraints.append(f"A multiple of {step}.")
    for key, attr, words in (
        ("minimum", "min", "At least {}."),
        ("maximum", "max", "At most {}."),
        ("exclusiveMinimum", None, "More than {}."),
        ("exclusiveMaximum", None, "Less than {}."),
    ):
        bound = _num_attr(prop, key)
        if bound is not None:
            if attr:
                form_field.attrs[attr] = str(bound)
            form_field.constraints.append(words.format(bound))
    if kind == "integer":
        form_field.constraints.insert(0, "A whole number.")
    return form_field


def _array_field(form_field: FormField, prop: dict[str, Any]) -> FormField:
    items = prop.get("items")
    if not isinstance(items, dict):
        raise _Unrenderable(f"The list {form_field.name!r} does not describe its items.")
    for keyword in NOT_RENDERABLE_KEYWORDS:
        if keyword in items:
            raise _Unrenderable(f"The list {form_field.name!r} uses {keyword} for its items.")
    choices = _choices_of(items)
    fewest, most = _int_attr(prop, "minItems"), _int_attr(prop, "maxItems")
    if choices is not None:
        form_field.widget = "checkboxes"
        form_field.choices = choices
        if fewest:
            form_field.constraints.append(f"Choose at least {fewest}.")
        if most is not None:
            form_field.constraints.append(f"Choose at most {most}.")
        return form_field
    if _single_type(items) == "string" and not items.get("format"):
        form_field.widget = "lines"
        form_field.constraints.append("One per line.")
        if fewest:
            form_field.constraints.append(f"At least {fewest}.")
        if most is not None:
            form_field.constraints.append(f"At most {most}.")
        return form_field
    raise _Unrenderable(f"The list {form_field.name!r} holds items this form cannot show.")


# --- validation -----------------------------------------------------------------------------------

_formats = FormatChecker(formats=())


@_formats.checks("email")
def _is_email(value: object) -> bool:
    return not isinstance(value, str) or bool(EMAIL.match(value))


@_formats.checks("uri")
def _is_uri(value: object) -> bool:
    if not isinstance(value, str):
        return True
    parts = urlsplit(value)
    return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", parts.scheme)) and " " not in value


@_formats.checks("date")
def _is_date(value: object) -> bool:
    if not isinstance(value, str):
        return True
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", value))


@_formats.checks("date-time")
def _is_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})", value):
        return False
    try:
        datetime.datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


FORMAT_WORDS = {"email": "an email address", "uri": "a URI", "date": "a date", "date-time": "a date and time"}


def _describe(error: jsonschema.ValidationError) -> str:
    keyword = error.validator
    value = error.validator_value
    match keyword:
        case "required":
            return "This field is required."
        case "type":
            kinds = value if isinstance(value, list) else [value]
            return f"Must be {' or '.join(str(k) for k in kinds)}."
        case "minLength":
            return f"At least {value} characters."
        case "maxLength":
            return f"At most {value} characters."
        case "minimum":
            return f"Must be at least {value}."
        case "maximum":
            return f"Must be at most {value}."
        case "exclusiveMinimum":
            return f"Must be more than {value}."
        case "exclusiveMaximum":
            return f"Must be less than {value}."
        case "multipleOf":
            return f"Must be a multiple of {value}."
        case "pattern":
            return f"Must match the pattern {str(value)[:200]}"
        case "enum" | "const":
            return "Choose one of the offered values."
        case "format":
            return f"Must be {FORMAT_WORDS.get(value, f'in the format {str(value)[:80]}')}."
        case "minItems":
            return f"Choose at least {value}."
        case "maxItems":
            return f"Choose at most {value}."
        case "uniqueItems":
            return "Each value may appear once."
        case "additionalProperties":
            return "Has arguments the tool does not take: " + error.message[:MAX_TEXT]
    return error.message[:MAX_TEXT]


def validate_arguments(schema: Any, arguments: Any) -> dict[str, str]:
    """Errors keyed by top-level property ("" for the arguments as a whole); empty when valid."""
    if not isinstance(arguments, dict):
        return {"": "The arguments must be a JSON object of named values."}
    if schema is None:
        return {}
    if not isinstance(schema, dict):
        return {"": "The tool's input schema is not a JSON object, so the arguments cannot be checked."}
    if _json_size(schema) > MAX_SCHEMA_CHARS:
        return {"": "The tool's input schema is too large to check the arguments against."}
    try:
        validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        validator_class.check_schema(schema)
        validator = validator_class(schema, format_checker=_formats)
        errors: dict[str, str] = {}
        for error in sorted(validator.iter_errors(arguments), key=lambda e: list(e.path)):
            if error.validator == "required" and not error.path:
                missing = [name for name in error.validator_value if name not in arguments]
                for name in missing:
                    errors.setdefault(str(name), "This field is required.")
                continue
            key = str(error.path[0]) if error.path else ""
            if key not in errors:
                errors[key] = _describe(error)
            if len(errors) >= MAX_ERRORS:
                break
        return errors
    except jsonschema.SchemaError as error:
        return {"": f"The tool's input schema is not valid JSON Schema (server says: {error.message[:300]})."}
    except Unresolvable:
        return {"": "The tool's input schema refers to another schema ($ref) that taskhub cannot resolve."}
    except Exception as error:  # a pathological schema…
        return {"": f"The arguments could not be checked against the tool's input schema ({type(error).__name__})."}
