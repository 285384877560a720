"""inputSchema → launch form → arguments: many schema shapes, hostile ones included; nothing here may raise."""

import json

import pytest
from django.http import QueryDict

from taskhub.tasks import input_forms
from taskhub.tasks.input_forms import build_form, defaults_of, validate_arguments


def post(**values) -> QueryDict:
    data = QueryDict(mutable=True)
    for name, value in values.items():
        key = "arg." + name
        if isinstance(value, list):
            data.setlist(key, value)
        else:
            data[key] = value
    return data


def obj(properties, required=None, **extra):
    schema = {"type": "object", "properties": properties, **extra}
    if required is not None:
        schema["required"] = required
    return schema


def field(form, name):
    return next(f for f in form.fields if f.name == name)


# --- what each shape becomes ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "widget", "input_type"),
    [
        ({"type": "string"}, "input", "text"),
        ({"type": "string", "format": "email"}, "input", "email"),
        ({"type": "string", "format": "uri"}, "input", "url"),
        ({"type": "string", "format": "date"}, "input", "date"),
        ({"type": "string", "format": "date-time"}, "input", "datetime-local"),
        ({"type": "string", "format": "hostname"}, "input", "text"),
        ({"type": "string", "maxLength": 5000}, "textarea", "text"),
        ({"type": ["string", "null"]}, "input", "text"),
        ({"type": "integer"}, "input", "number"),
        ({"type": "number"}, "input", "number"),
        ({"type": "boolean", "default": False}, "checkbox", "text"),
        ({"type": "boolean"}, "tristate", "text"),
        ({"enum": ["a", "b"]}, "select", "text"),
        ({"type": "string", "enum": ["a", "b"], "enumNames": ["A", "B"]}, "select", "text"),
        ({"oneOf": [{"const": 1, "title": "One"}, {"const": 2, "title": "Two"}]}, "select", "text"),
        ({"anyOf": [{"const": "x"}, {"const": "y"}]}, "select", "text"),
        ({"type": "array", "items": {"enum": ["r", "g"]}}, "checkboxes", "text"),
        ({"type": "array", "items": {"anyOf": [{"const": "r", "title": "Red"}]}}, "checkboxes", "text"),
        ({"type": "array", "items": {"type": "string"}}, "lines", "text"),
    ],
)
def test_each_renderable_shape_gets_its_widget(prop, widget, input_type):
    form = build_form(obj({"p": prop}))
    assert form.renderable, form.reason
    assert (form.fields[0].widget, form.fields[0].input_type) == (widget, input_type)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (5, "not a JSON object"),
        ("a string", "not a JSON object"),
        ([], "not a JSON object"),
        ({"type": "array"}, "does not describe an object"),
        ({"type": "object", "properties": []}, "properties are not a JSON object"),
        ({"type": "object", "properties": {"a": 5}}, "'a' is not described by a JSON object"),
        ({"type": "object", "properties": {"a": True}}, "'a' is not described by a JSON object"),
        ({"type": "object", "properties": {"a": None}}, "'a' is not described by a JSON object"),
        (obj({"a": {"type": "object", "properties": {}}}), "type object"),
        (obj({"a": {"$ref": "#/$defs/x"}}), "uses $ref"),
        ({"$ref": "#/$defs/args", "$defs": {"args": {}}}, "uses $ref"),
        (obj({"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}), "anyOf with options that are not simple"),
        (obj({"a": {"type": ["string", "integer"]}}), "several types"),
        (obj({"a": {"type": 7}}), "type is not a name"),
        (obj({"a": {"enum": [{"x": 1}, {"y": 2}]}}), "not plain text"),
        (obj({"a": {"enum": [[1], [2]]}}), "not plain text"),
        (obj({"a": {"enum": []}}), "non-empty list"),
        (obj({"a": {"enum": "abc"}}), "non-empty list"),
        (obj({"a": {"enum": list(range(501))}}), "more than 500"),
        (obj({"a": {}}), "no type"),
        (obj({"a": {"type": "array"}}), "does not describe its items"),
        (obj({"a": {"type": "array", "items": {"type": "object"}}}), "items this form cannot show"),
        (obj({"a": {"type": "null"}}), "type null"),
        (obj({}, required="a"), "required list"),
        (obj({}, required=[1]), "required list"),
        (obj({}, required=["ghost"]), "does not describe it"),
        (obj({f"p{i}": {"type": "string"} for i in range(101)}), "more than 100"),
        (obj({"a": {"type": "string", "description": "x" * 300_000}}), "too large"),
        ({"type": "object", "oneOf": [{}, {}]}, "uses oneOf"),
        ({"type": "object", "allOf": [{}]}, "uses allOf"),
        (obj({"a": {"type": "string", "if": {}}}), "uses if"),
    ],
)
def test_what_the_form_cannot_show_says_why_and_never_raises(schema, reason):
    form = build_form(schema)
    assert not form.renderable
    assert reason in form.reason
    assert form.fields == []


def test_a_deeply_nested_schema_does_not_crash():
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"x": deep}}
    form = build_form(deep)
    assert not form.renderable
    assert validate_arguments(deep, {"x": {}})  # an error message, not an exception


def test_a_missing_schema_means_no_arguments():
    form = build_form(None)
    assert form.renderable and form.fields == []
    assert validate_arguments(None, {}) == {}


# --- labels, help, constraints, defaults ----------------------------------------------------------------


def test_titles_descriptions_and_constraints_are_plain_text_for_the_page():
    form = build_form(
        obj(
            {
                "name": {"type": "string", "title": "<b>Name</b>", "description": "<script>x</script>", "minLength": 2},
                "n": {"type": "integer", "minimum": 1, "maximum": 9, "title": 5},
                "x": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5},
            },
            required=["name"],
        )
    )
    name, n, x = (field(form, key) for key in ("name", "n", "x"))
    assert (name.label, name.help, name.required) == ("<b>Name</b>", "<script>x</script>", True)
    assert name.attrs == {"minlength": "2"} and "At least 2 characters." in name.constraints
    assert n.label == "n"  # a title that is not text is ignored
    assert n.attrs == {"step": "1", "min": "1", "max": "9"}
    assert "More than 0." in x.constraints and x.attrs["step"] == "0.5"
    assert form.fields[0].name == "name"  # required first


def test_defaults_prefill_each_kind_of_field():
    schema = obj(
        {
            "s": {"type": "string", "default": "hello"},
            "i": {"type": "integer", "default": 3},
            "b": {"type": "boolean", "default": True},
            "e": {"enum": ["a", "b"], "default": "b"},
            "m": {"type": "array", "items": {"enum": ["r", "g", "b"]}, "default": ["g", "b"]},
            "l": {"type": "array", "items": {"type": "string"}, "default": ["x", "y"]},
            "t": {"type": "string", "format": "date-time", "default": "2026-03-01T10:00:00+02:00"},
            "bad": {"type": "integer", "default": {"not": "a number"}},
        }
    )
    form = build_form(schema)
    assert field(form, "s").value == "hello"
    assert field(form, "i").value == "3"
    assert field(form, "b").checked
    assert field(form, "e").selected == {"1"}
    assert field(form, "m").selected == {"1", "2"}
    assert field(form, "l").value == "x\ny"
    assert field(form, "t").value == "2026-03-01T08:00:00"
    assert field(form, "bad").value == ""
    assert defaults_of(schema)["s"] == "hello"


def test_enum_titles_and_values_of_every_json_type_round_trip():
    form = build_form(obj({"v": {"enum": ["a", 1, 2.5, True, None]}}))
    values, ok = form.arguments_from(post(v="3"))
    assert ok and values == {"v": True}
    values, _ = form.arguments_from(post(v="4"))
    assert values == {"v": None}
    titled = build_form(obj({"c": {"oneOf": [{"const": "r", "title": "Red"}, {"const": "g"}]}}))
    assert [(c.label, c.value) for c in titled.fields[0].choices] == [("Red", "r"), ("g", "g")]


# --- posted values to arguments -----------------------------------------------------------------------------


def test_posted_values_become_typed_arguments():
    schema = obj(
        {
            "s": {"type": "string"},
            "i": {"type": "integer"},
            "f": {"type": "number"},
            "whole": {"type": "number"},
            "b": {"type": "boolean", "default": False},
            "t": {"type": "boolean"},
            "d": {"type": "string", "format": "date-time"},
            "m": {"type": "array", "items": {"enum": ["r", "g", "b"]}},
            "l": {"type": "array", "items": {"type": "string"}},
            "empty": {"type": "string"},
        }
    )
    form = build_form(schema)
    values, ok = form.arguments_from(
        post(
            s=" keep spaces ",
            i="42",
            f="2.5",
            whole="7",
            b="on",
            t="0",
            d="2026-01-02T03:04",
            m=["0", "2", "9"],
            l="one\n\n two \n",
            empty="",
        )
    )
    assert ok
    assert values == {
        "s": " keep spaces ",
        "i": 42,
        "f": 2.5,
        "whole": 7,
        "b": True,
        "t": False,
        "d": "2026-01-02T03:04:00Z",
        "m": ["r", "b"],
        "l": ["one", "two"],
    }
    assert validate_arguments(schema, values) == {}


@pytest.mark.parametrize(
    ("prop", "text", "error"),
    [
        ({"type": "integer"}, "4.5", "Enter a whole number."),
        ({"type": "integer"}, "ten", "Enter a whole number."),
        ({"type": "number"}, "nan", "Enter a number."),
        ({"type": "number"}, "inf", "Enter a number."),
        ({"type": "number"}, "1e", "Enter a number."),
    ],
)
def test_text_that_is_no_number_is_an_error_on_its_field(prop, text, error):
    form = build_form(obj({"p": prop}))
    values, ok = form.arguments_from(post(p=text))
    assert not ok and values == {}
    assert form.fields[0].error == error
    assert form.fields[0].value == text  # shown again as typed


def test_required_fields_left_empty_are_errors_and_optional_ones_are_left_out():
    form = build_form(
        obj({"r": {"type": "string"}, "c": {"enum": ["a"]}, "o": {"type": "string"}}, required=["r", "c"])
    )
    values, ok = form.arguments_from(post(r="", c="", o=""))
    assert not ok and values == {}
    assert field(form, "r").error == "This field is required."
    assert field(form, "c").error == "Choose a value."
    assert field(form, "o").error == ""


def test_hostile_posts_do_not_crash():
    form = build_form(obj({"c": {"enum": ["a"]}, "m": {"type": "array", "items": {"enum": ["x"]}}}))
    values, ok = form.arguments_from(post(c="99", m=["-1", "abc", "0"]))
    assert ok and values == {"m": ["x"]}


# --- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "value", "message"),
    [
        ({"type": "string", "maxLength": 3}, "abcd", "At most 3 characters."),
        ({"type": "string", "minLength": 3}, "ab", "At least 3 characters."),
        ({"type": "string", "pattern": "^[a-z]+$"}, "ABC", "Must match the pattern ^[a-z]+$"),
        ({"type": "string", "format": "email"}, "not-an-email", "Must be an email address."),
        ({"type": "string", "format": "uri"}, "no scheme", "Must be a URI."),
        ({"type": "string", "format": "date"}, "2026-13-01", "Must be a date."),
        ({"type": "string", "format": "date-time"}, "2026-01-01T10:00", "Must be a date and time."),
        ({"type": "integer", "minimum": 5}, 4, "Must be at least 5."),
        ({"type": "integer", "maximum": 5}, 6, "Must be at most 5."),
        ({"type": "number", "exclusiveMinimum": 0}, 0, "Must be more than 0."),
        ({"type": "integer", "multipleOf": 5}, 7, "Must be a multiple of 5."),
        ({"type": "integer"}, "7", "Must be integer."),
        ({"enum": ["a", "b"]}, "c", "Choose one of the offered values."),
        ({"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1}, [], "Choose at least 1."),
        ({"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 1}, ["a", "b"], "Choose at most 1."),
        ({"type": "array", "uniqueItems": True}, ["a", "a"], "Each value may appear once."),
    ],
)
def test_validation_names_the_field_and_says_what_is_wrong(prop, value, message):
    assert validate_arguments(obj({"p": prop}), {"p": value}) == {"p": message}


def test_valid_formats_pass():
    schema = obj(
        {
            "e": {"type": "string", "format": "email"},
            "u": {"type": "string", "format": "uri"},
            "d": {"type": "string", "format": "date"},
            "t": {"type": "string", "format": "date-time"},
        }
    )
    values = {"e": "a@b.example", "u": "https://x.example/p?q=1", "d": "2026-02-28", "t": "2026-02-28T10:00:00+01:00"}
    assert validate_arguments(schema, values) == {}


def test_missing_required_and_extra_arguments():
    schema = obj({"a": {"type": "string"}, "b": {"type": "string"}}, required=["a", "b"], additionalProperties=False)
    errors = validate_arguments(schema, {"zzz": 1})
    assert errors["a"] == errors["b"] == "This field is required."
    assert errors[""].startswith("Has arguments the tool does not take")


@pytest.mark.parametrize(
    ("schema", "arguments", "message"),
    [
        (obj({}), [1], "must be a JSON object"),
        (obj({}), "x", "must be a JSON object"),
        ("nope", {}, "is not a JSON object"),
        ({"type": "object", "properties": {"a": {"type": "strnig"}}}, {"a": 1}, "not valid JSON Schema"),
        ({"type": "object", "properties": {"a": {"$ref": "https://example.invalid/s.json"}}}, {"a": 1}, "($ref)"),
        ({"$ref": "#/nowhere"}, {}, "($ref)"),
        (obj({"a": {"type": "string", "description": "x" * 300_000}}), {}, "too large"),
    ],
)
def test_validation_of_broken_schemas_gives_a_message_not_an_exception(schema, arguments, message):
    errors = validate_arguments(schema, arguments)
    assert message in errors[""]


def test_validation_follows_local_refs():
    schema = {
        "type": "object",
        "$defs": {"port": {"type": "integer", "maximum": 65535}},
        "properties": {"port": {"$ref": "#/$defs/port"}},
    }
    assert validate_arguments(schema, {"port": 70000}) == {"port": "Must be at most 65535."}
    assert validate_arguments(schema, {"port": 80}) == {}


def test_an_older_draft_is_honoured():
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **obj({"n": {"type": "integer", "maximum": 3}})}
    assert validate_arguments(schema, {"n": 4}) == {"n": "Must be at most 3."}


def test_many_errors_are_capped():
    schema = obj({f"p{i}": {"type": "integer"} for i in range(80)})
    errors = validate_arguments(schema, {f"p{i}": "x" for i in range(80)})
    assert len(errors) == input_forms.MAX_ERRORS  # 80 fields fail; only the first MAX_ERRORS are reported
    json.dumps(errors)
