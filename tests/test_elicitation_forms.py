"""requestedSchema → form fields → content: every supported shape, and hostile ones that must never crash."""

import pytest
from django.http import QueryDict

from taskhub.tasks.answers import content_errors
from taskhub.tasks.elicitation_forms import FIELD_PREFIX, build_form, parse_submission
from taskhub.tasks.input_cards import url_target


def post(**values) -> QueryDict:
    data = QueryDict(mutable=True)
    for name, value in values.items():
        for item in value if isinstance(value, list) else [value]:
            data.appendlist(FIELD_PREFIX + name, item)
    return data


def one(prop, required=False, **kwargs):
    schema = {"type": "object", "properties": {"x": prop}, "required": ["x"] if required else []}
    form = build_form(schema, **kwargs)
    assert form.renderable, form.problem
    return form.fields[0]


@pytest.mark.parametrize(
    ("prop", "widget", "input_type"),
    [
        ({"type": "string"}, "text", "text"),
        ({"type": "string", "format": "email"}, "email", "email"),
        ({"type": "string", "format": "uri"}, "url", "url"),
        ({"type": "string", "format": "date"}, "date", "date"),
        ({"type": "string", "format": "date-time"}, "datetime", "datetime-local"),
        ({"type": "string", "format": "hostname"}, "text", "text"),
        ({"type": "string", "format": 7}, "text", "text"),
        ({"type": "number"}, "number", "number"),
        ({"type": "integer"}, "number", "number"),
        ({"type": "boolean"}, "checkbox", "checkbox"),
        ({"type": "string", "enum": ["a", "b"]}, "select", "select"),
        ({"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}, "multi", "multi"),
    ],
)
def test_each_type_gets_its_widget(prop, widget, input_type):
    field = one(prop)
    assert (field.widget, field.input_type) == (widget, input_type)


def test_titles_descriptions_required_and_bounds():
    field = one(
        {
            "type": "string",
            "title": "Your <b>name</b>",
            "description": "as on the badge",
            "minLength": 2,
            "maxLength": 9,
        },
        required=True,
    )
    assert (field.label, field.help, field.required) == ("Your <b>name</b>", "as on the badge", True)
    assert field.attrs == {"minlength": "2", "maxlength": "9"}
    number = one({"type": "integer", "minimum": 1, "maximum": 5.0})
    assert number.attrs == {"step": "1", "min": "1", "max": "5"}
    assert one({"type": "number", "minimum": 0.5}).attrs == {"step": "any", "min": "0.5"}
    assert one({"type": "string"}).label == "x"  # no title: the property name


def test_defaults_are_prefilled():
    assert one({"type": "string", "default": "hi"}).value == "hi"
    assert one({"type": "integer", "default": 3}).value == "3"
    assert one({"type": "boolean", "default": True}).checked is True
    assert one({"type": "boolean"}).checked is False
    select = one({"type": "string", "enum": ["a", "b"], "default": "b"})
    assert [c.selected for c in select.choices] == [False, True]
    multi = one({"type": "array", "items": {"enum": ["a", "b", "c"]}, "default": ["a", "c", 5]})
    assert [c.selected for c in multi.choices] == [True, False, True]
    assert one({"type": "string", "format": "date-time", "default": "2026-07-28T16:30:00+02:00"}).value == (
        "2026-07-28T14:30"
    )
    assert one({"type": "string", "format": "date-time", "default": "not a time"}).value == ""
    assert one({"type": "integer", "default": "3"}).value == ""  # a default of the wrong type is ignored


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
    assert [(c.value, c.label) for c in one(prop).choices] == choices


def test_a_required_choice_without_default_starts_on_its_first_option():
    required = one({"type": "string", "enum": ["a", "b"]}, required=True)
    assert ([c.selected for c in required.choices], required.placeholder) == ([True, False], False)
    optional = one({"type": "string", "enum": ["a", "b"]})
    assert ([c.selected for c in optional.choices], optional.placeholder) == ([False, False], True)


def test_submitted_values_are_kept_when_shown_again():
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
    form = build_form(schema, submitted=post(name="typed", n="abc", size="m", tags=["b"]), errors={"n": "bad"})
    name, n, ok, size, tags = (
        next(f for f in form.fields if f.name == key) for key in ("name", "n", "ok", "size", "tags")
    )
    assert (name.value, n.value, n.error, ok.checked) == ("typed", "abc", "bad", False)
    assert [c.selected for c in size.choices] == [False, True]
    assert [c.selected for c in tags.choices] == [False, True]


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


def test_a_submission_becomes_typed_content():
    form = build_form(SCHEMA)
    content, problems = parse_submission(
        form,
        post(name=" Luca ", when="2026-07-28T14:30", count="3", ratio="0.25", agree="true", size="m", tags=["a", "b"]),
    )
    assert problems == {}
    assert content == {
        "name": " Luca ",
        "when": "2026-07-28T14:30:00Z",
        "count": 3,
        "ratio": 0.25,
        "agree": True,
        "size": "m",
        "tags": ["a", "b"],
        "must": [],
    }
    assert content_errors(SCHEMA, content) == {}


def test_empty_optional_fields_are_left_out_and_unchecked_boxes_are_false():
    content, problems = parse_submission(build_form(SCHEMA), post(name="", count="", size=""))
    assert (content, problems) == ({"agree": False, "must": []}, {})


@pytest.mark.parametrize(
    ("field", "raw", "expected"),
    [
        ("count", "abc", "must be a whole number"),
        ("ratio", "half", "must be a number"),
        ("ratio", "inf", "must be a number"),
    ],
)
def test_text_that_is_no_number_is_named(field, raw, expected):
    content, problems = parse_submission(build_form(SCHEMA), post(**{field: raw}))
    assert problems == {field: expected}
    assert field not in content


def test_numbers_keep_their_kind():
    form = build_form(SCHEMA)
    assert parse_submission(form, post(count="2.5"))[0]["count"] == 2.5  # the validator says "whole number"
    assert parse_submission(form, post(count="4.0"))[0]["count"] == 4
    assert parse_submission(form, post(ratio="1"))[0]["ratio"] == 1
    assert parse_submission(form, post(when="2026-07-28T14:30:00+02:00"))[0]["when"] == "2026-07-28T14:30:00+02:00"


@pytest.mark.parametrize(
    "schema",
    [
        None,
        "a string",
        ["a", "list"],
        {"type": "object", "properties": ["name"]},
        {"type": "object", "properties": "name"},
        {"type": "object", "properties": {"x": {"type": "string"}}, "required": "x"},
        {"type": "object", "properties": {"x": {"type": "string"}}, "required": [{"x": 1}]},
        {"type": "object", "properties": {"x": "string"}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"enum": ["a"]}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "string", "enum": [{"a": 1}, {"b": 2}]}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "string", "enum": "abc"}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "string", "enum": []}}, "required": ["x"]},
        {
            "type": "object",
            "properties": {"x": {"type": "string", "oneOf": [{"title": "no const"}]}},
            "required": ["x"],
        },
        {"type": "object", "properties": {"x": {"type": "string", "minLength": "5"}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "integer", "maximum": "ten"}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "array"}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "array", "items": [1, 2]}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "string"}}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": "object"}}, "required": ["x"]},
        {"type": "object", "properties": {"x": {"type": ["string", "null"]}}, "required": ["x"]},
        {
            "type": "object",
            "properties": {"x": {"type": "array", "items": {"enum": ["a"]}, "maxItems": -1}},
            "required": ["x"],
        },
    ],
)
def test_hostile_schemas_are_refused_in_words_never_with_a_crash(schema):
    form = build_form(schema)
    assert not form.renderable
    assert form.problem
    assert parse_submission(form, post(x="1")) == ({}, {})


def test_an_optional_field_that_cannot_be_rendered_is_shown_and_left_out():
    schema = {"type": "object", "properties": {"odd": {"type": "object"}, "name": {"type": "string"}}}
    form = build_form(schema)
    assert form.renderable
    _name, odd = form.fields
    assert odd.widget == "unsupported" and "'object'" in odd.problem
    assert parse_submission(form, post(odd="x", name="n")) == ({"name": "n"}, {})


def test_required_fields_come_first_in_their_order_then_the_rest_by_name():
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in ("b", "Zed", "a", "long", "c")}}
    schema["required"] = ["long", "c", "missing"]
    assert [f.name for f in build_form(schema).fields] == ["long", "c", "a", "b", "Zed"]


def test_no_properties_at_all_is_a_plain_confirmation():
    for schema in ({"type": "object"}, {"type": "object", "properties": {}}, {"type": "object", "properties": None}):
        form = build_form(schema)
        assert form.renderable and form.fields == []


@pytest.mark.parametrize(
    ("url", "clickable", "host"),
    [
        ("https://example.com/authorize?x=1", True, "example.com"),
        ("HTTPS://Example.COM/", True, "example.com"),
        ("https://google.com@evil.example/", True, "evil.example"),
        ("http://127.0.0.1:8000/cb", True, "127.0.0.1"),
        ("http://localhost/cb", True, "localhost"),
        ("http://[::1]/cb", True, "::1"),
        ("http://example.com/", False, "example.com"),
        ("javascript:alert(1)", False, ""),
        ("data:text/html,<script>alert(1)</script>", False, ""),
        ("ftp://example.com/file", False, "example.com"),
        ("https:///nohost", False, ""),
        ("https://exa mple.com/", False, "exa mple.com"),
        ("https://example.com:notaport/", False, ""),
        ("", False, ""),
        (None, False, ""),
        (["https://example.com"], False, ""),
    ],
)
def test_only_https_or_loopback_http_urls_are_clickable(url, clickable, host):
    target = url_target(url)
    assert (target.clickable, target.host) == (clickable, host)
    if not clickable:
        assert target.problem
