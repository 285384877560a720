"""taskhub's `taskhub_i18n` template library keeps a quoted `{% translate %}` per language
(taskhub/web/templatetags/taskhub_i18n.py): every form of the tag renders as Django's own `i18n` renders it, in each
language, and taskhub's templates load it."""

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.template import Context, engines
from django.template.engine import Engine
from django.utils import translation

from taskhub.web.templatetags import taskhub_i18n

# Every form of {% translate %}: quoted, with percent signs, markup, a context, `as`, `noop`, a variable, a filter;
# and the other tags of the library, which are Django's.
SOURCE = (
    "{% load taskhub_i18n %}"
    "{% translate 'Accept' %}|{% translate \"Sign out\" %}|{% trans 'Decline' %}|{% translate '100% done, 50%% left' %}"
    "|{% translate '<b>bold</b> & more' %}|{% translate 'Main' context 'navigation' %}"
    "|{% translate 'Cancel' as cancel %}[{{ cancel }}]|{% translate 'Accept' noop %}|{% translate word %}"
    "|{% translate 'Accept'|upper %}|{% translate hostile %}"
    "|{% blocktranslate with who=hostile %}answered by {{ who }}{% endblocktranslate %}"
    "|{% get_current_language as LANGUAGE_CODE %}{{ LANGUAGE_CODE }}|{{ 'zh-hans'|language_name_local }}"
    # {% blocktranslate %}: with values (escaped, filtered, missing), trimmed, `as`, 100%, `count`, `context`, and
    # inside a loop, so each node renders several values
    "|{% for tool in tools %}{% blocktranslate with id=pk|stringformat:'s'|slice:':8' %}Tick {{ tool }} task {{ id }}"
    "{% endblocktranslate %};{% endfor %}"
    "|{% blocktranslate trimmed with token=hostile %}\n  via the API token\n  {{ token }}\n{% endblocktranslate %}"
    "|{% blocktranslate asvar said with who=hostile %}answered by {{ who }}{% endblocktranslate %}[{{ said }}]"
    "|{% blocktranslate %}100% of {{ word }} and {{ missing }}{% endblocktranslate %}"
    "|{% blocktranslate count n=tools|length %}{{ n }} request waits for you{% plural %}{{ n }} requests wait for you"
    "{% endblocktranslate %}"
    "|{% blocktranslate context 'navigation' %}Main{% endblocktranslate %}"
    "|{% autoescape off %}{% blocktranslate with who=hostile %}answered by {{ who }}{% endblocktranslate %}"
    "{% endautoescape %}"
)
CONTEXT = {
    "word": "Notifications",
    "hostile": "<script>alert('x')</script>",
    "tools": ["deploy", "<b>drop</b>", "copy_rows"],
    "pk": "6f1c2d3e-4b5a-4c6d-8e7f-0123456789ab",
}


def djangos_engine() -> Engine:
    return Engine(libraries={"taskhub_i18n": "django.templatetags.i18n"})


def test_taskhubs_templates_load_this_library_not_djangos():
    template = engines["django"].from_string("{% load taskhub_i18n %}{% translate 'Accept' %}")
    assert isinstance(template.template.nodelist[-1], taskhub_i18n.TranslateNode)
    loads = re.compile(r"{%\s*load\s([^%]*)%}")
    for path in Path(settings.BASE_DIR, "templates").rglob("*.*"):
        for libraries in loads.findall(path.read_text()):
            assert "i18n" not in libraries.split(), f"{path}: load taskhub_i18n"


@pytest.mark.parametrize(
    ("language", "begins"), [("en", "Accept|Sign out|Decline|"), ("zh-hans", "接受|退出登录|拒绝|")]
)
def test_every_form_renders_as_djangos_library_renders_it(language, begins):
    ours = engines["django"].from_string(SOURCE)
    djangos = djangos_engine().from_string(SOURCE)
    with translation.override(language):
        expected = djangos.render(Context(dict(CONTEXT)))
        assert ours.render(dict(CONTEXT)) == expected
        assert ours.render(dict(CONTEXT)) == expected  # again, from what the nodes kept
    assert expected.startswith(begins)


def test_a_quoted_translation_follows_the_language_of_each_render():
    template = engines["django"].from_string(
        "{% load taskhub_i18n %}{% translate 'Notifications' %}|"
        "{% blocktranslate with who=name %}answered by {{ who }}{% endblocktranslate %}"
    )
    with translation.override("en"):
        english = template.render({"name": "olga"})
    with translation.override("zh-hans"):
        chinese = template.render({"name": "olga"})
    with translation.override("en"):
        assert template.render({"name": "dana"}) == "Notifications|answered by dana"
    assert english == "Notifications|answered by olga"
    assert chinese == "通知|由 olga 回答"
