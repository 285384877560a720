"""taskhub's `{% url %}` and `|truncatechars` (taskhub/web/template_builtins.py, every template's builtins) give what
Django's give, for every shape of URL and argument, whatever the script prefix, current app, language or URLconf, and
for every kind of text."""

import uuid

import pytest
from django.conf.urls.i18n import i18n_patterns
from django.template import Context, engines
from django.template.engine import Engine
from django.test import RequestFactory, override_settings
from django.urls import NoReverseMatch, include, path, register_converter, set_script_prefix
from django.urls.converters import UUIDConverter
from django.utils import translation
from django.utils.functional import lazy
from django.utils.safestring import mark_safe

from taskhub.web import template_builtins


class HexConverter(UUIDConverter):
    """Writes a UUID as 32 hex digits: a converter that rewrites the argument it is given."""

    regex = "[0-9a-f]{32}"

    def to_url(self, value):
        return value.hex


register_converter(HexConverter, "builtins_test_hex")


def view(request, **kwargs):  # pragma: no cover - only reversed
    raise AssertionError


app_patterns = ([path("thing/<int:n>/", view, name="thing"), path("home/", view, name="home")], "app")
urlpatterns = [
    path("t/<uuid:task_id>/", view, name="task"),
    path("plain/", view, name="plain"),
    path("two/<uuid:a>/<int:b>/", view, name="two"),
    path("mixed/<int:n>/<path:rest>/", view, name="mixed"),
    path("hex/<builtins_test_hex:u>/", view, name="hex"),
    path("q/<str:word>/", view, name="word"),
    path("a/", include(app_patterns, namespace="first")),
    path("b/", include(app_patterns, namespace="second")),
    *i18n_patterns(path("loc/<int:n>/", view, name="localised")),
]

TASK = uuid.UUID("6f1c2d3e-4b5a-4c6d-8e7f-0123456789ab")
OTHER = uuid.UUID("00000000-0000-4000-8000-000000000001")
URL_SOURCES = [
    "{% url 'plain' %}",
    "{% url 'task' task %}",
    "{% url 'task' other %}",
    "{% url 'task' task as href %}[{{ href }}]",
    "{% url 'two' task 7 %}",
    "{% url 'two' other 0 %}",
    "{% url 'two' task big %}",
    "{% url 'mixed' 3 'some/where' %}",
    "{% url 'hex' task %}",
    "{% url 'word' 'x y&z' %}",
    "{% url 'word' task %}",
    "{% url 'app:thing' 4 %}",
    "{% url 'app:home' %}",
    "{% url 'first:thing' 5 %}",
    "{% url 'second:home' %}",
    "{% url 'localised' 6 %}",
    "{% url name task %}",
    "{% url 'task' task_id=task %}",
    "{% url 'two' task 7 as two %}{{ two }}",
    "{% url 'plain' as plain %}{{ plain }}|{% url 'plain' %}",
    "{% url 'task' 'not-a-uuid' as missing %}[{{ missing }}]",
    "{% url 'two' task -1 as negative %}[{{ negative }}]",
    "{% url 'two' task yes as boolean %}[{{ boolean }}]",
    "{% url 'nowhere' as nowhere %}[{{ nowhere }}]",
    "{% autoescape off %}{% url 'word' '<&>' %}{% endautoescape %}",
]
URL_CONTEXT = {"task": TASK, "other": OTHER, "big": 10**12, "name": "task", "yes": True}


def djangos_engine() -> Engine:
    return Engine()  # Django's builtins only


def render_both(source: str, context: dict, request=None) -> tuple[str, str]:
    ours = engines["django"].from_string(source)
    djangos = djangos_engine().from_string(source)
    results = []
    for template in (ours.template, djangos):
        rendered = []
        for _ in range(2):  # the second render from what our nodes kept
            full = Context(dict(context))
            if request is not None:
                full.request = request
            rendered.append(template.render(full))
        assert rendered[0] == rendered[1]
        results.append(rendered[0])
    return results[0], results[1]


def test_every_template_has_the_kept_url_node_and_the_quick_filter():
    template = engines["django"].from_string("{% url 'tasks:list' %}{{ text|truncatechars:5 }}").template
    assert isinstance(template.nodelist[0], template_builtins.KeptURLNode)
    assert template.nodelist[1].filter_expression.filters[0][0] is template_builtins.truncatechars


@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.parametrize("source", URL_SOURCES)
@pytest.mark.parametrize("language", ["en", "zh-hans"])
@pytest.mark.parametrize("current_app", [None, "first"])
@pytest.mark.parametrize("prefix", ["/", "/under/here/"])
def test_a_url_is_what_djangos_tag_gives(source, language, current_app, prefix):
    request = RequestFactory().get("/")
    if current_app:
        request.current_app = current_app
    set_script_prefix(prefix)
    try:
        with translation.override(language):
            ours, djangos = render_both(source, URL_CONTEXT, request)
    finally:
        set_script_prefix("/")
    assert ours == djangos


@override_settings(ROOT_URLCONF=__name__)
def test_the_kept_urls_follow_the_script_prefix_the_app_and_the_language():
    template = (
        engines["django"]
        .from_string("{% url 'task' task %}|{% url 'app:home' %}|{% url 'localised' 6 %}|{% url 'two' task 7 %}")
        .template
    )
    request = RequestFactory().get("/")

    def render(task) -> str:
        context = Context({"task": task})
        context.request = request
        return template.render(context)

    # Each render changes one thing from the first, whose URLs the nodes keep. With no current app, Django takes
    # the app's last instance.
    assert render(TASK) == f"/t/{TASK}/|/b/home/|/en/loc/6/|/two/{TASK}/7/"
    with translation.override("zh-hans"):
        assert render(OTHER) == f"/t/{OTHER}/|/b/home/|/zh-hans/loc/6/|/two/{OTHER}/7/"
    request.current_app = "first"
    assert render(OTHER) == f"/t/{OTHER}/|/a/home/|/en/loc/6/|/two/{OTHER}/7/"
    request.current_app = None
    set_script_prefix("/sub/")
    try:
        assert render(TASK) == f"/sub/t/{TASK}/|/sub/b/home/|/sub/en/loc/6/|/sub/two/{TASK}/7/"
    finally:
        set_script_prefix("/")
    with override_settings(ROOT_URLCONF="taskhub.urls"), pytest.raises(NoReverseMatch):
        render(TASK)


@override_settings(ROOT_URLCONF=__name__)
def test_a_converter_that_rewrites_its_argument_is_reversed_by_django_every_time():
    template = engines["django"].from_string("{% url 'hex' task %}")
    assert template.render({"task": TASK}) == f"/hex/{TASK.hex}/"
    assert template.render({"task": OTHER}) == f"/hex/{OTHER.hex}/"


@override_settings(ROOT_URLCONF=__name__)
def test_a_url_that_does_not_reverse_raises_as_djangos_does():
    for source, context in [
        ("{% url 'nowhere' %}", {}),
        ("{% url 'task' 'not-a-uuid' %}", {}),
        ("{% url 'two' task -1 %}", {"task": TASK}),
        ("{% url 'two' task yes %}", {"task": TASK, "yes": True}),
    ]:
        template = engines["django"].from_string(source)
        for _ in range(2):
            with pytest.raises(NoReverseMatch):
                template.render(context)


def test_taskhubs_own_urls_are_what_reverse_gives():
    template = engines["django"].from_string(
        "{% url 'tasks:detail' task %}|{% url 'tasks:answer' 12 %}|{% url 'tasks:list' %}|{% url 'web:home' %}"
    )
    djangos = djangos_engine().from_string(
        "{% url 'tasks:detail' task %}|{% url 'tasks:answer' 12 %}|{% url 'tasks:list' %}|{% url 'web:home' %}"
    )
    for task in (TASK, OTHER):
        assert template.render({"task": task}) == djangos.render(Context({"task": task}))


TEXTS = [
    "",
    "short",
    "exactly ten",
    "a status message of the server that is longer than the limit",
    "naïve café",
    "e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301e\u0301",  # combining accents
    "Å" * 3 + "A\u030a" * 3,  # not NFC
    "中文的状态消息比限制更长一些的文字",
    "<script>alert('x')</script> & more",
    mark_safe("<b>safe</b> text that is long enough to be cut"),
    mark_safe("<b>ok</b>"),
    lazy(lambda: "a lazy text, long enough to be cut short", str)(),
    None,
    12345678901234,
    ["a", "list"],
]


@pytest.mark.parametrize("length", ["0", "-1", "1", "5", "10", "11", "12", "300", "x"])
@pytest.mark.parametrize("autoescape", ["on", "off"])
def test_truncatechars_is_what_djangos_filter_gives(length, autoescape):
    source = "{% autoescape " + autoescape + " %}{{ text|truncatechars:" + repr(length) + " }}{% endautoescape %}"
    for text in TEXTS:
        ours, djangos = render_both(source, {"text": text})
        assert ours == djangos, (text, length)
        value = template_builtins.truncatechars(text, length)
        expected = template_builtins.defaultfilters.truncatechars(text, length)
        assert value == expected and type(value) is type(expected), (text, length)
