"""A JSON schema as fields, typed values and verdicts: taskhub.mcp.schema_fields and its two uses.

The table at the end holds the promise of the module: for each (schema, value) the launch form, the answer
form, the API (launch and answer) and the CLI (`--args` and a typed answer) give the same verdict in the
same words. Everything before it checks the builder, the conversions and the validator on their own,
hostile schemas included; nothing here may raise.
"""

import json
import re

import jsonschema
import pytest
from django.contrib.auth.models import Group
from django.http import QueryDict
from django.test import Client
from django.urls import reverse

from taskhub.accounts.groups import APPROVERS, OPERATORS
from taskhub.api.tokens import create_token
from taskhub.mcp import schema_fields
from taskhub.mcp.cli import answer_from_reply, argument_errors
from taskhub.mcp.schema_fields import (
    ELICITATION,
    MAX_ERRORS,
    OMIT,
    TOOL,
    FieldInputError,
    build_fields,
    defaults_of,
    validate,
    value_from_text,
)
from taskhub.servers.services import create_server
from taskhub.tasks.models import InputRequest, InputRequestState, Task
from taskhub.tasks.schema_forms import answer_form, launch_form
from tests.account_fixtures import make_user
from tests.approval_fixtures import add_approver_groups
from tests.catalogue_fixtures import with_tools
from tests.inbox_fixtures import request_of, task_asking


def post(use, **values) -> QueryDict:
    data = QueryDict(mutable=True)
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            data.appendlist(use.html_prefix + name, item)
    return data


def obj(properties, required=None, **extra):
    schema = {"type": "object", "properties": properties, **extra}
    if required is not None:
        schema["required"] = required
    return schema


def field(form, name):
    return next(f for f in form.fields if f.name == name)


def one(prop, use=ELICITATION, required=False):
    fields = build_fields(obj({"x": prop}, ["x"] if required else []), use)
    assert fields.renderable, fields.problem
    return fields.fields[0]


# --- what each shape becomes ----------------------------------------------------------------------------

BOTH = (TOOL, ELICITATION)


@pytest.mark.parametrize(
    ("prop", "widget", "input_type", "uses"),
    [
        ({"type": "string"}, "input", "text", BOTH),
        ({"type": "string", "format": "email"}, "input", "email", BOTH),
        ({"type": "string", "format": "uri"}, "input", "url", BOTH),
        ({"type": "string", "format": "date"}, "input", "date", BOTH),
        ({"type": "string", "format": "date-time"}, "input", "datetime-local", BOTH),
        ({"type": "string", "format": "hostname"}, "input", "text", BOTH),
        ({"type": "string", "format": 7}, "input", "text", (TOOL,)),
        ({"type": "string", "maxLength": 5000}, "textarea", "text", BOTH),
        ({"type": ["string", "null"]}, "input", "text", (TOOL,)),
        ({"type": "integer"}, "input", "number", BOTH),
        ({"type": "number"}, "input", "number", BOTH),
        ({"type": "boolean", "default": False}, "checkbox", "text", BOTH),
        ({"type": "boolean"}, "tristate", "text", (TOOL,)),
        ({"type": "boolean"}, "checkbox", "text", (ELICITATION,)),
        ({"enum": ["a", "b"]}, "select", "text", (TOOL,)),
        ({"type": "string", "enum": ["a", "b"]}, "select", "text", BOTH),
        ({"type": "string", "enum": ["a", "b"], "enumNames": ["A", "B"]}, "select", "text", BOTH),
        ({"oneOf": [{"const": 1, "title": "One"}, {"const": 2, "title": "Two"}]}, "select", "text", (TOOL,)),
        ({"anyOf": [{"const": "x"}, {"const": "y"}]}, "select", "text", (TOOL,)),
        ({"type": "array", "items": {"enum": ["r", "g"]}}, "checkboxes", "text", BOTH),
        ({"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, "checkboxes", "text", BOTH),
        ({"type": "array", "items": {"anyOf": [{"const": "r", "title": "Red"}]}}, "checkboxes", "text", BOTH),
        ({"type": "array", "items": {"type": "string"}}, "lines", "text", (TOOL,)),
    ],
)
def test_each_renderable_shape_gets_its_widget(prop, widget, input_type, uses):
    for use in uses:
        form_field = one(prop, use)
        assert (form_field.widget, form_field.input_type) == (widget, input_type), use.subject


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        (5, "not a JSON object"),
        ("a string", "not a JSON object"),
        ([], "not a JSON object"),
        ({"type": "array"}, "does not describe an object"),
        ({"type": "object", "properties": []}, "properties are not a JSON object"),
        ({"type": "object", "properties": "name"}, "properties are not a JSON object"),
        ({"type": "object", "properties": {"a": 5}}, "'a' is not described by a JSON object"),
        ({"type": "object", "properties": {"a": True}}, "'a' is not described by a JSON object"),
        ({"type": "object", "properties": {"a": None}}, "'a' is not described by a JSON object"),
        (obj({"a": {"type": "object", "properties": {}}}), "type object"),
        (obj({"a": {"$ref": "#/$defs/x"}}), "uses $ref"),
        ({"$ref": "#/$defs/args", "$defs": {"args": {}}}, "uses $ref"),
        (obj({"a": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}), "anyOf with options that are not simple"),
        (obj({"a": {"type": "string", "oneOf": [{"title": "no const"}]}}), "oneOf with options that are not simple"),
        (obj({"a": {"type": ["string", "integer"]}}), "several types"),
        (obj({"a": {"type": 7}}), "type is not a name"),
        (obj({"a": {"enum": [{"x": 1}, {"y": 2}]}}), "not plain text"),
        (obj({"a": {"enum": [[1], [2]]}}), "not plain text"),
        (obj({"a": {"enum": []}}), "non-empty list"),
        (obj({"a": {"enum": "abc"}}), "non-empty list"),
        (obj({"a": {"enum": list(range(501))}}), "more than 500"),
        (obj({"a": {}}), "no type"),
        (obj({"a": {"type": "array"}}), "does not describe its items"),
        (obj({"a": {"type": "array", "items": [1, 2]}}), "does not describe its items"),
        (obj({"a": {"type": "array", "items": {"type": "object"}}}), "items this form cannot show"),
        (obj({"a": {"type": "array", "items": {"enum": ["a"]}, "maxItems": -1}}), "maxItems that is not a whole"),
        (obj({"a": {"type": "string", "minLength": "5"}}), "minLength that is not a number"),
        (obj({"a": {"type": "integer", "maximum": "ten"}}), "maximum that is not a number"),
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
def test_a_tool_form_that_cannot_be_shown_says_why_and_never_raises(schema, reason):
    fields = build_fields(schema, TOOL)
    assert not fields.renderable
    assert reason in fields.problem
    assert fields.fields == []
    assert launch_form(schema).read(post(TOOL, a="1")) == ({}, {})


@pytest.mark.parametrize(
    "prop",
    [
        "string",
        {"enum": ["a"]},  # the restricted schema wants a type
        {"type": "string", "enum": [{"a": 1}, {"b": 2}]},
        {"type": "string", "enum": [1, 2]},  # choices are text
        {"type": "string", "enum": "abc"},
        {"type": "string", "enum": []},
        {"type": "string", "oneOf": [{"title": "no const"}]},
        {"type": "string", "minLength": "5"},
        {"type": "integer", "maximum": "ten"},
        {"type": "array"},
        {"type": "array", "items": [1, 2]},
        {"type": "array", "items": {"type": "string"}},  # no free-text lists in an elicitation
        {"type": "object"},
        {"type": ["string", "null"]},
        {"type": "array", "items": {"enum": ["a"]}, "maxItems": -1},
    ],
)
def test_an_elicitation_that_needs_a_field_taskhub_cannot_render_is_refused_in_words(prop):
    fields = build_fields(obj({"x": prop}, ["x"]), ELICITATION)
    assert not fields.renderable
    assert fields.problem
    assert answer_form(obj({"x": prop}, ["x"])).read(post(ELICITATION, x="1")) == ({}, {})


@pytest.mark.parametrize(
    "schema",
    [None, "a string", ["a", "list"], {"type": "object", "properties": ["name"]}, {"type": "array"}],
)
def test_an_elicitation_schema_of_the_wrong_shape_is_refused(schema):
    fields = build_fields(schema, ELICITATION)
    assert not fields.renderable and fields.problem


def test_an_optional_field_that_cannot_be_rendered_is_shown_and_left_out_of_an_answer_only():
    schema = {"type": "object", "properties": {"odd": {"type": "object"}, "name": {"type": "string"}}}
    form = answer_form(schema)
    assert form.renderable
    _name, odd = form.fields
    assert odd.widget == "unsupported" and "type object" in odd.problem
    assert form.read(post(ELICITATION, odd="x", name="n")) == ({"name": "n"}, {})
    assert not launch_form(schema).renderable  # a tool's form falls back to JSON


def test_a_deeply_nested_schema_does_not_crash():
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "object", "properties": {"x": deep}}
    assert not build_fields(deep, TOOL).renderable
    assert validate(deep, {"x": {}}, TOOL)  # an error message, not an exception


def test_a_missing_schema_means_no_fields():
    fields = build_fields(None, TOOL)
    assert fields.renderable and fields.fields == []
    assert validate(None, {}, TOOL) == {}
    for schema in ({"type": "object"}, {"type": "object", "properties": {}}, {"type": "object", "properties": None}):
        for use in BOTH:
            fields = build_fields(schema, use)
            assert fields.renderable and fields.fields == []


def test_required_fields_come_first_in_their_order_then_the_rest_by_name():
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in ("b", "Zed", "a", "long", "c")}}
    schema["required"] = ["long", "c"]
    for use in BOTH:
        assert [f.name for f in build_fields(schema, use).fields] == ["long", "c", "a", "b", "Zed"]


# --- labels, help, constraints, defaults ----------------------------------------------------------------


def test_titles_descriptions_and_constraints_are_plain_text_for_the_page():
    form = launch_form(
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


def test_bounds_become_input_attributes():
    text = one({"type": "string", "title": "Your <b>name</b>", "minLength": 2, "maxLength": 9}, required=True)
    assert (text.label, text.required, text.attrs) == ("Your <b>name</b>", True, {"minlength": "2", "maxlength": "9"})
    assert one({"type": "integer", "minimum": 1, "maximum": 5.0}).attrs == {"step": "1", "min": "1", "max": "5"}
    assert one({"type": "number", "minimum": 0.5}).attrs == {"step": "any", "min": "0.5"}
    assert one({"type": "string", "format": "date-time", "minLength": 3}).attrs == {"step": "1"}
    assert one({"type": "string"}).label == "x"  # no title: the property name
    multi = one({"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2})
    assert multi.constraints == ["Pick at least 1.", "Pick at most 2."]


def test_defaults_prefill_each_kind_of_field():
    schema = obj(
        {
            "s": {"type": "string", "default": "hello"},
            "i": {"type": "integer", "default": 3},
            "b": {"type": "boolean", "default": True},
            "e": {"enum": ["a", "b"], "default": "b"},
            "m": {"type": "array", "items": {"enum": ["r", "g", "b"]}, "default": ["g", "b", 5]},
            "l": {"type": "array", "items": {"type": "string"}, "default": ["x", "y"]},
            "t": {"type": "string", "format": "date-time", "default": "2026-03-01T10:00:00+02:00"},
            "t2": {"type": "string", "format": "date-time", "default": "not a time"},
            "bad": {"type": "integer", "default": {"not": "a number"}},
            "text3": {"type": "integer", "default": "3"},
            "off": {"type": "boolean"},
        }
    )
    form = launch_form(schema)
    assert field(form, "s").value == "hello"
    assert field(form, "i").value == "3"
    assert field(form, "b").checked
    assert [c.selected for c in field(form, "e").choices] == [False, True]
    assert [c.selected for c in field(form, "m").choices] == [False, True, True]
    assert field(form, "l").value == "x\ny"
    assert field(form, "t").value == "2026-03-01T08:00:00"
    assert field(form, "t2").value == ""
    assert field(form, "bad").value == field(form, "text3").value == ""
    assert not any(c.selected for c in field(form, "off").choices)
    assert defaults_of(schema)["s"] == "hello"


def test_a_choice_starts_empty_unless_a_required_one_has_a_default():
    """Nothing is chosen for the person: a required choice without default must be picked (both forms)."""
    for use in BOTH:
        required = one({"type": "string", "enum": ["a", "b"]}, use, required=True)
        assert ([c.selected for c in required.choices], required.placeholder) == ([False, False], True)
        chosen = one({"type": "string", "enum": ["a", "b"], "default": "b"}, use, required=True)
        assert ([c.selected for c in chosen.choices], chosen.placeholder) == ([False, True], False)
        optional = one({"type": "string", "enum": ["a", "b"], "default": "a"}, use)
        assert ([c.selected for c in optional.choices], optional.placeholder) == ([True, False], True)


@pytest.mark.parametrize(
    ("prop", "choices"),
    [
        ({"type": "string", "enum": ["s", "m"]}, [("s", "s"), ("m", "m")]),
        ({"type": "string", "enum": ["s", "m"], "enumNames": ["Small", "Medium"]}, [("s", "Small"), ("m", "Medium")]),
        ({"type": "string", "enum": ["s", "m"], "enumNames": ["Small"]}, [("s", "s"), ("m", "m")]),
        ({"type": "string", "oneOf": [{"const": "r", "title": "Red"}, {"const": "g"}]}, [("r", "Red"), ("g", "g")]),
        ({"type": "array", "items": {"anyOf": [{"const": "x", "title": "Ex"}]}}, [("x", "Ex")]),
        ({"type": "array", "items": {"type": "string", "oneOf": [{"const": "y", "title": "Why"}]}}, [("y", "Why")]),
    ],
)
def test_choices_with_and_without_titles(prop, choices):
    for use in BOTH:
        assert [(c.value, c.label) for c in one(prop, use).choices] == choices


def test_a_choice_is_posted_as_its_value_in_an_answer_and_as_its_position_on_the_launch_form():
    prop = {"type": "string", "enum": ["s", "m"]}
    assert [c.token for c in one(prop, ELICITATION).choices] == ["s", "m"]
    assert [c.token for c in one(prop, TOOL).choices] == ["0", "1"]


def test_enum_values_of_every_json_type_round_trip_on_the_launch_form():
    form = launch_form(obj({"v": {"enum": ["a", 1, 2.5, True, None]}}))
    assert form.read(post(TOOL, v="3")) == ({"v": True}, {})
    assert form.read(post(TOOL, v="4")) == ({"v": None}, {})


# --- posted values to typed values -----------------------------------------------------------------------


def test_posted_launch_values_become_typed_arguments():
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
    form = launch_form(schema)
    values, problems = form.read(
        post(
            TOOL,
            s=" keep spaces ",
            i="42",
            f="2.5",
            whole="7",
            b="on",
            t="0",
            d="2026-01-02T03:04",
            m=["0", "2"],
            l="one\n\n two \n",
            empty="",
        )
    )
    assert problems == {}
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
    assert validate(schema, values, TOOL) == {}


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "when": {"type": "string", "format": "date-time"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "agree": {"type": "boolean"},
        "size": {"type": "string", "enum": ["s", "m"]},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
        "must": {"type": "array", "items": {"enum": ["a", "b"]}},
    },
    "required": ["must"],
}


def test_a_posted_answer_becomes_typed_content():
    values, problems = answer_form(SCHEMA).read(
        post(
            ELICITATION,
            name=" Luca ",
            when="2026-07-28T14:30",
            count="3",
            ratio="0.25",
            agree="true",
            size="m",
            tags=["a", "b"],
        )
    )
    assert problems == {}
    assert values == {
        "name": " Luca ",
        "when": "2026-07-28T14:30:00Z",
        "count": 3,
        "ratio": 0.25,
        "agree": True,
        "size": "m",
        "tags": ["a", "b"],
        "must": [],
    }
    assert validate(SCHEMA, values, ELICITATION) == {}


def test_empty_optional_fields_are_left_out_and_unchecked_boxes_are_false():
    values, problems = answer_form(SCHEMA).read(post(ELICITATION, name="", count="", size=""))
    assert (values, problems) == ({"agree": False, "must": []}, {})


def test_numbers_keep_their_kind_and_a_typed_zone_is_kept():
    form = answer_form(SCHEMA)
    assert form.read(post(ELICITATION, count="4.0"))[0]["count"] == 4
    assert form.read(post(ELICITATION, ratio="1"))[0]["ratio"] == 1
    assert form.read(post(ELICITATION, ratio="\u22121.5"))[0]["ratio"] == -1.5
    when = "2026-07-28T14:30:00+02:00"
    assert form.read(post(ELICITATION, when=when))[0]["when"] == when


@pytest.mark.parametrize(
    ("prop", "text", "error"),
    [
        ({"type": "integer"}, "4.5", "must be a whole number"),
        ({"type": "integer"}, "ten", "must be a whole number"),
        ({"type": "number"}, "half", "must be a number"),
        ({"type": "number"}, "nan", "must be a number"),
        ({"type": "number"}, "inf", "must be a number"),
        ({"type": "number"}, "1e", "must be a number"),
    ],
)
def test_text_that_is_no_number_is_an_error_on_its_field_in_both_forms(prop, text, error):
    for form in (launch_form(obj({"p": prop})), answer_form(obj({"p": prop}))):
        values, problems = form.read(post(form.use, p=text))
        assert (values, problems) == ({}, {"p": error})
        assert form.fields[0].error == error
        assert form.fields[0].value == text  # shown again as typed


def test_a_posted_choice_that_was_not_offered_is_an_error_not_a_silent_gap():
    form = launch_form(obj({"c": {"enum": ["a"]}, "m": {"type": "array", "items": {"enum": ["x"]}}}))
    assert form.read(post(TOOL, c="99", m=["-1", "abc", "0"])) == (
        {},
        {"c": "must be one of a", "m": "-1 not among the choices (x)"},
    )
    assert form.read(post(TOOL, c="", m=["0"])) == ({"m": ["x"]}, {})


def test_a_refused_answer_is_shown_again_with_what_was_typed():
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "default": "dflt"},
            "n": {"type": "integer"},
            "ok": {"type": "boolean", "default": True},
            "size": {"type": "string", "enum": ["s", "m"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
        },
    }
    submitted = post(ELICITATION, name="typed", n="abc", size="m", tags=["b"])
    form = answer_form(schema, submitted=submitted, errors={"n": "bad"})
    name, n, ok, size, tags = (field(form, key) for key in ("name", "n", "ok", "size", "tags"))
    assert (name.value, n.value, n.error, ok.checked) == ("typed", "abc", "bad", False)
    assert [c.selected for c in size.choices] == [False, True]
    assert [c.selected for c in tags.choices] == [False, True]


def test_a_terminal_line_becomes_a_typed_value():
    fields = {
        f.name: f
        for f in build_fields(
            obj(
                {
                    "ok": {"type": "boolean"},
                    "size": {"type": "string", "oneOf": [{"const": "s", "title": "Small"}, {"const": "m"}]},
                    "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
                    "n": {"type": "integer", "default": 3},
                    "when": {"type": "string", "format": "date-time"},
                }
            ),
            ELICITATION,
        ).fields
    }
    assert [value_from_text(fields["ok"], text) for text in ("yes", "N", "true")] == [True, False, True]
    assert [value_from_text(fields["size"], text) for text in ("1", "Small", "m")] == ["s", "s", "m"]
    assert value_from_text(fields["tags"], "2, a") == ["b", "a"]
    assert value_from_text(fields["n"], "") == 3 and value_from_text(fields["when"], "") is OMIT
    assert value_from_text(fields["when"], "2026-07-28 14:30") == "2026-07-28T14:30:00Z"
    for name, text, message in (
        ("ok", "maybe", "must be true or false"),
        ("size", "9", "must be one of s, m"),
        ("tags", "a, z", "z not among the choices (a, b)"),
        ("n", "x", "must be a whole number"),
    ):
        with pytest.raises(FieldInputError, match=re.escape(message)):
            value_from_text(fields[name], text)


# --- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prop", "value", "message"),
    [
        ({"type": "string", "maxLength": 3}, "abcd", "must be at most 3 characters long"),
        ({"type": "string", "minLength": 3}, "ab", "must be at least 3 characters long"),
        ({"type": "string", "pattern": "^[a-z]+$"}, "ABC", "must match the pattern ^[a-z]+$"),
        ({"type": "string", "format": "hostname"}, "anything", None),  # formats taskhub does not know pass
        ({"type": "number", "exclusiveMinimum": 0}, 0, "must be more than 0"),
        ({"type": "number", "exclusiveMaximum": 1}, 1, "must be less than 1"),
        ({"type": "integer", "multipleOf": 5}, 7, "must be a multiple of 5"),
        ({"type": ["integer", "null"]}, "7", "must be a whole number or null"),
        ({"type": "array", "uniqueItems": True}, ["a", "a"], "each choice may be picked once"),
        ({"type": "array", "items": {"enum": ["a", "b"]}}, "a", "must be a list of choices"),
        ({"type": "object", "properties": {"host": {"type": "string"}}}, {"host": 1}, "host: must be text"),
        ({"const": "yes"}, "no", "must be one of yes"),
    ],
)
def test_validation_of_what_only_a_tool_may_ask(prop, value, message):
    assert validate(obj({"p": prop}), {"p": value}, TOOL) == ({"p": message} if message else {})


def test_extra_values_are_refused_when_not_asked_for():
    schema = obj({"a": {"type": "string"}, "b": {"type": "string"}}, required=["a", "b"], additionalProperties=False)
    assert validate(schema, {"zzz": 1}, TOOL) == {
        "zzz": "this field was not asked for",
        "a": "this field is required",
        "b": "this field is required",
    }
    assert validate(obj({"a": {"type": "string"}}), {"zzz": 1}, TOOL) == {}  # a tool's schema may allow them
    assert validate(obj({"a": {"type": "string"}}), {"zzz": 1}, ELICITATION) == {"zzz": "this field was not asked for"}


@pytest.mark.parametrize(
    ("schema", "values", "message"),
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
def test_validation_of_broken_schemas_gives_a_message_not_an_exception(schema, values, message):
    assert message in validate(schema, values, TOOL)[""]


def test_a_schema_is_checked_against_its_metaschema_once_and_its_values_every_time(monkeypatch):
    # The metaschema check was most of an answer's validation time: it is kept per schema text; the values are not.
    monkeypatch.setattr(schema_fields, "_schema_checks", {})
    checks = []
    check_schema = jsonschema.Draft202012Validator.check_schema
    monkeypatch.setattr(
        jsonschema.Draft202012Validator,
        "check_schema",
        classmethod(lambda cls, schema, **kw: checks.append(schema) or check_schema(schema, **kw)),
    )
    schema = obj({"n": {"type": "integer", "maximum": 3, "title": "checked once"}})
    broken = obj({"n": {"type": "integr", "title": "checked once"}})
    for _ in range(2):
        assert validate(schema, {"n": 4}, TOOL) == {"n": "must be at most 3"}
        assert validate(schema, {"n": 2}, TOOL) == {}
        assert "not valid JSON Schema" in validate(broken, {"n": 2}, TOOL)[""]
    assert checks == [schema, broken]
    assert validate(obj({"n": {"type": "integer", "maximum": 5, "title": "checked once"}}), {"n": 4}, TOOL) == {}
    assert len(checks) == 3  # another schema is checked on its own


def test_validation_follows_local_refs_and_older_drafts():
    schema = {
        "type": "object",
        "$defs": {"port": {"type": "integer", "maximum": 65535}},
        "properties": {"port": {"$ref": "#/$defs/port"}},
    }
    assert validate(schema, {"port": 70000}, TOOL) == {"port": "must be at most 65535"}
    assert validate(schema, {"port": 80}, TOOL) == {}
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **obj({"n": {"type": "integer", "maximum": 3}})}
    assert validate(draft7, {"n": 4}, TOOL) == {"n": "must be at most 3"}


def test_many_errors_are_capped():
    schema = obj({f"p{i}": {"type": "integer"} for i in range(80)})
    errors = validate(schema, {f"p{i}": "x" for i in range(80)}, TOOL)
    assert len(errors) == MAX_ERRORS  # 80 fields fail; only the first MAX_ERRORS are reported
    json.dumps(errors)


def test_one_format_checker_for_everything():
    checker = schema_fields.FORMAT_CHECKER
    assert set(checker.checkers) == {"email", "uri", "date", "date-time"}


# --- one verdict, one message, on every front -------------------------------------------------------------

MISSING = object()  # the field is left out (an empty form field, an empty terminal line)
OK = None
DATE_TIME = {"type": "string", "format": "date-time"}
EMAIL = {"type": "string", "format": "email"}
URI = {"type": "string", "format": "uri"}
SIZES = {"type": "string", "oneOf": [{"const": "S", "title": "Small"}, {"const": "M", "title": "Medium"}]}
TOPPINGS = {"type": "array", "items": {"type": "string", "enum": ["cheese", "ham"]}, "minItems": 1, "maxItems": 1}
DATE_TIME_WORDS = "must be a date and time with a time zone and seconds, like 2026-07-28T14:30:00Z"
URI_WORDS = "must be an absolute URI like https://example.com/page"

# (property, required, value, verdict): the value as JSON (API, `--args`), and as typed into a form or on a
# terminal (str(value); a list is several boxes ticked; MISSING is nothing typed); verdict None is "accepted".
FRONT_CASES = [
    (DATE_TIME, False, "2026-07-28T14:30:00Z", OK),
    (DATE_TIME, False, "2026-07-28T14:30:00.250Z", OK),
    (DATE_TIME, False, "2026-07-28T14:30:00+02:00", OK),
    (DATE_TIME, False, "2026-07-28t14:30:00z", OK),
    (DATE_TIME, False, "2026-07-28T14:30Z", DATE_TIME_WORDS),  # RFC 3339 wants the seconds
    (DATE_TIME, False, "2026-07-28T14:30+02:00", DATE_TIME_WORDS),
    (DATE_TIME, False, "2026-07-28", DATE_TIME_WORDS),
    (DATE_TIME, False, "2026-02-30T10:00:00Z", DATE_TIME_WORDS),
    (DATE_TIME, False, "yesterday", DATE_TIME_WORDS),
    ({"type": "string", "format": "date"}, False, "2026-07-28", OK),
    ({"type": "string", "format": "date"}, False, "2026-02-30", "must be a date like 2026-07-28"),
    ({"type": "string", "format": "date"}, False, "28/07/2026", "must be a date like 2026-07-28"),
    ({"type": "string", "format": "date"}, False, "20260728", "must be a date like 2026-07-28"),
    (EMAIL, False, "ada@example.com", OK),
    (EMAIL, False, "ada-at-example", "must be an email address like name@example.com"),
    (EMAIL, False, "ada@example", "must be an email address like name@example.com"),
    (URI, False, "https://example.com/page?q=1", OK),
    (URI, False, "mailto:ada@example.com", OK),
    (URI, False, "urn:isbn:0451450523", OK),
    (URI, False, "javascript:alert(1)", OK),  # a URI all the same; taskhub never opens values as links
    (URI, False, "example.com/page", URI_WORDS),  # no scheme
    (URI, False, "/relative/path", URI_WORDS),
    (URI, False, "//example.com/x", URI_WORDS),
    (URI, False, "https://exa mple.com/", URI_WORDS),
    (URI, False, "https:", URI_WORDS),
    ({"type": "integer"}, False, 3, OK),
    ({"type": "integer"}, False, 4.0, OK),
    ({"type": "integer"}, False, 2.5, "must be a whole number"),
    ({"type": "integer"}, False, "three", "must be a whole number"),
    ({"type": "number"}, False, 2.5, OK),
    ({"type": "number"}, False, 7, OK),
    ({"type": "number"}, False, "half", "must be a number"),
    ({"type": "integer", "minimum": 1, "maximum": 5}, False, 1, OK),
    ({"type": "integer", "minimum": 1, "maximum": 5}, False, 0, "must be at least 1"),
    ({"type": "integer", "minimum": 1, "maximum": 5}, False, 6, "must be at most 5"),
    ({"type": "number", "minimum": 0, "maximum": 1}, False, 1.5, "must be at most 1"),
    ({"type": "string", "minLength": 2, "maxLength": 4}, False, "ab", OK),
    ({"type": "string", "minLength": 2, "maxLength": 4}, False, "a", "must be at least 2 characters long"),
    ({"type": "string", "minLength": 2, "maxLength": 4}, False, "abcde", "must be at most 4 characters long"),
    ({"type": "string", "enum": ["S", "M"]}, False, "M", OK),
    ({"type": "string", "enum": ["S", "M"]}, False, "XL", "must be one of S, M"),
    (SIZES, False, "S", OK),
    (SIZES, False, "XL", "must be one of S, M"),
    (TOPPINGS, False, ["ham"], OK),
    (TOPPINGS, False, ["pineapple"], "pineapple not among the choices (cheese, ham)"),
    (TOPPINGS, False, ["cheese", "ham"], "pick at most 1"),
    (TOPPINGS, True, [], "pick at least 1"),
    ({"type": "string"}, True, "anything", OK),
    ({"type": "string"}, True, MISSING, "this field is required"),
    ({"type": "integer"}, True, MISSING, "this field is required"),
    ({"type": "string", "enum": ["S", "M"]}, True, MISSING, "this field is required"),
    ({"type": "string"}, False, MISSING, OK),
]
# Values no form or terminal can type: checked by the fronts that take JSON (API, `--args`).
JSON_ONLY_CASES = [
    ({"type": "integer"}, False, True, "must be a whole number"),
    ({"type": "integer"}, False, "3", "must be a whole number"),
    ({"type": "number"}, False, "2.5", "must be a number"),
    ({"type": "string"}, False, 42, "must be text"),
    ({"type": "boolean"}, False, "yes", "must be true or false"),
    ({"type": "boolean"}, False, False, OK),
    (TOPPINGS, False, "ham", "must be a list of choices"),
    ({**TOPPINGS, "maxItems": 2, "uniqueItems": True}, False, ["ham", "ham"], "each choice may be picked once"),
]


@pytest.fixture
def front(db):
    """A server whose tool `probe` and whose question ask for the same property `x`; a person who may do both."""
    server = create_server(name="probe-server", transport="http", url="http://127.0.0.1:9/mcp", user=None)
    add_approver_groups(server, Group.objects.create(name="probers"))
    person = make_user("pat", OPERATORS, APPROVERS, "probers")
    _, secret = create_token(user=person, name="tests")
    browser = Client()
    browser.force_login(person)
    return {"server": server, "browser": browser, "api": Client(headers={"Authorization": f"Bearer {secret}"})}


def _schema(prop, required):
    return obj({"x": prop}, ["x"] if required else [])


def _posted(form_field, value):
    """What a form posts for `value`: a choice by its token (a value not offered, as is)."""
    if value is MISSING:
        return None
    if form_field.choices:
        tokens = {choice.value: choice.token for choice in form_field.choices}
        return [tokens.get(v, v) for v in value] if isinstance(value, list) else tokens.get(value, value)
    return str(value)


def launch_form_verdict(front, schema, value):
    form = launch_form(schema)
    raw = _posted(form.fields[0], value)
    data = {"mode": "form"} | ({TOOL.html_prefix + "x": raw} if raw is not None else {})
    response = front["browser"].post(reverse("tasks:launch_tool", args=[front["server"].pk, "probe"]), data)
    if response.status_code == 302:
        return OK
    assert response.status_code == 400, response.status_code
    return field(response.context["form"], "x").error


def answer_form_verdict(front, input_request, schema, value):
    raw = _posted(answer_form(schema).fields[0], value)
    data = {"action": "accept"} | ({ELICITATION.html_prefix + "x": raw} if raw is not None else {})
    response = front["browser"].post(reverse("tasks:answer", args=[input_request.pk]), data)
    if response.status_code == 302:
        return OK
    assert response.status_code == 400, response.status_code
    card = next(card for card in response.context["cards"] if card.pk == input_request.pk)
    return field(card.form, "x").error


def api_launch_verdict(front, value):
    body = {"server": front["server"].name, "tool": "probe", "arguments": {} if value is MISSING else {"x": value}}
    response = front["api"].post("/api/tasks", data=json.dumps(body), content_type="application/json")
    if response.status_code == 201:
        return OK
    assert response.status_code == 400, response.json()
    return response.json()["fields"]["x"]


def api_answer_verdict(front, input_request, value):
    body = {"action": "accept", "content": {} if value is MISSING else {"x": value}}
    url = f"/api/input-requests/{input_request.pk}/answer"
    response = front["api"].post(url, data=json.dumps(body), content_type="application/json")
    if response.status_code == 200:
        return OK
    assert response.status_code == 400, response.json()
    return response.json()["fields"]["x"]


def cli_args_verdict(schema, value):
    problems = argument_errors({"name": "probe", "inputSchema": schema}, {} if value is MISSING else {"x": value})
    return problems.removeprefix("x: ") or OK


def cli_prompt_verdict(schema, value):
    form_field = build_fields(schema, ELICITATION).fields[0]
    if value is MISSING:
        typed = ""
    elif isinstance(value, list):
        typed = ", ".join(value)
    else:
        typed = str(value)
    try:
        answer_from_reply(form_field, typed)
    except ValueError as error:
        return str(error)
    return OK


def _asking(front, schema):
    question = {"method": "elicitation/create", "params": {"message": "?", "requestedSchema": schema}}
    task = task_asking(front["server"], {"form": question, "api": question})
    return request_of(task, "form"), request_of(task, "api")


@pytest.mark.parametrize(("prop", "required", "value", "verdict"), FRONT_CASES)
def test_every_front_gives_the_same_verdict_in_the_same_words(front, prop, required, value, verdict):
    schema = _schema(prop, required)
    with_tools(front["server"], {"name": "probe", "inputSchema": schema})
    by_form, by_api = _asking(front, schema)
    verdicts = {
        "launch form": launch_form_verdict(front, schema, value),
        "answer form": answer_form_verdict(front, by_form, schema, value),
        "API launch": api_launch_verdict(front, value),
        "API answer": api_answer_verdict(front, by_api, value),
        "CLI --args": cli_args_verdict(schema, value),
        "CLI answer": cli_prompt_verdict(schema, value),
    }
    assert verdicts == dict.fromkeys(verdicts, verdict)
    launched = Task.objects.filter(tool="probe").count()
    assert launched == (2 if verdict is OK else 0)  # the launch form and the API; nothing when refused
    answered = {by_form.key, by_api.key} if verdict is OK else set()
    assert {ir.key for ir in InputRequest.objects.filter(state=InputRequestState.ANSWERED)} == answered


@pytest.mark.parametrize(("prop", "required", "value", "verdict"), JSON_ONLY_CASES)
def test_the_json_fronts_give_the_same_verdict_in_the_same_words(front, prop, required, value, verdict):
    schema = _schema(prop, required)
    with_tools(front["server"], {"name": "probe", "inputSchema": schema})
    _, by_api = _asking(front, schema)
    verdicts = {
        "API launch": api_launch_verdict(front, value),
        "API answer": api_answer_verdict(front, by_api, value),
        "CLI --args": cli_args_verdict(schema, value),
    }
    assert verdicts == dict.fromkeys(verdicts, verdict)


def test_a_nested_object_is_refused_by_an_elicitation_but_allowed_for_a_tool(front):
    schema = _schema({"type": "object", "properties": {"host": {"type": "string"}}, "required": ["host"]}, True)
    with_tools(front["server"], {"name": "probe", "inputSchema": schema})
    by_form, by_api = _asking(front, schema)

    assert not launch_form(schema).renderable  # the launch page takes it as JSON
    url = reverse("tasks:launch_tool", args=[front["server"].pk, "probe"])
    refused = front["browser"].post(url, {"mode": "json", "arguments_json": '{"x": {"host": 5}}'})
    assert refused.status_code == 400 and refused.context["json_error"] == "x: host: must be text"
    assert front["browser"].post(url, {"mode": "json", "arguments_json": '{"x": {"host": "h"}}'}).status_code == 302
    assert api_launch_verdict(front, {"host": "h"}) is OK
    assert cli_args_verdict(schema, {"host": "h"}) is OK and cli_args_verdict(schema, {}) == "this field is required"

    form = answer_form(schema)
    assert not form.renderable and "type object" in form.problem
    card = front["browser"].post(reverse("tasks:answer", args=[by_form.pk]), {"action": "accept"})
    assert card.status_code == 400
    body = {"action": "accept", "content": {"x": {"host": "h"}}}
    response = front["api"].post(
        f"/api/input-requests/{by_api.pk}/answer", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 400 and "cannot be answered" in response.json()["error"]
