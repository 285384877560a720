"""The form renderer (settings.FORM_RENDERER): Django's, with its commonest widget templates written in Python.

Django renders a widget through templates: a `<select>` is select.html, then select_option.html and attrs.html once
per option, each an `{% include %}` with a context of its own. The task list's filter bar (eleven widgets, about forty
options) spent 3.4 ms of the page's CPU there (bench/pages.py, py-spy; 8 % of the list at 1,000,000 tasks), more
than the rows' tags of five tasks. Those few templates are simple enough to write out here, byte for byte what
Django's give (tests/test_form_renderer.py renders each widget both ways and requires the same bytes). Anything else,
and any widget whose context is unusual for them (an option with a template of its own, a label that is not text),
goes through Django's templates as before.
"""

from django.forms.renderers import DjangoTemplates
from django.utils.functional import Promise
from django.utils.html import conditional_escape
from django.utils.safestring import SafeString, mark_safe

WIDGETS = "django/forms/widgets/"
SELECT = WIDGETS + "select.html"
SELECT_OPTION = WIDGETS + "select_option.html"
# Each of these is `{% include "django/forms/widgets/input.html" %}`.
INPUTS = frozenset(
    WIDGETS + name
    for name in (
        "input.html",
        "text.html",
        "date.html",
        "datetime.html",
        "time.html",
        "email.html",
        "url.html",
        "number.html",
        "search.html",
        "password.html",
        "hidden.html",
        "checkbox.html",
    )
)


class FormRenderer(DjangoTemplates):
    def render(self, template_name, context, request=None):
        widget = context.get("widget") if isinstance(context, dict) else None
        html = None
        if widget is not None:
            if template_name == SELECT:
                html = _select(widget)
            elif template_name in INPUTS:
                html = _input(widget)
        if html is None:
            return super().render(template_name, context, request=request)
        return html


def _text(value) -> bool:
    # What the templates print as it is: other values (numbers, dates) they would localize.
    return isinstance(value, str | Promise)


def _attrs(attrs: dict) -> str:
    """attrs.html: ` name="value"` each, ` name` for True, nothing for False."""
    parts = []
    for name, value in attrs.items():
        if value is False:
            continue
        if value is True:
            parts.append(f" {conditional_escape(name)}")
        else:
            parts.append(f' {conditional_escape(name)}="{conditional_escape(str(value))}"')
    return "".join(parts)


def _input(widget: dict) -> SafeString:
    """input.html, and the templates that only include it (a renderer strips what it renders)."""
    value = widget["value"]
    shown = f' value="{conditional_escape(str(value))}"' if value != None else ""  # noqa: E711 (as input.html)
    return mark_safe(
        f'<input type="{conditional_escape(widget["type"])}" name="{conditional_escape(widget["name"])}"'
        f"{shown}{_attrs(widget['attrs'])}>"
    )


def _select(widget: dict) -> SafeString | None:
    """select.html with select_option.html; None (Django's templates) for an option it would not render alike."""
    parts = [f'<select name="{conditional_escape(widget["name"])}"{_attrs(widget["attrs"])}>']
    for group_name, options, _index in widget["optgroups"]:
        if group_name:
            if not _text(group_name):
                return None
            parts.append(f'\n  <optgroup label="{conditional_escape(group_name)}">')
        for option in options:
            if option.get("template_name") != SELECT_OPTION or not _text(option["label"]):
                return None
            parts.append(
                f'\n  <option value="{conditional_escape(str(option["value"]))}"'
                f"{_attrs(option['attrs'])}>{conditional_escape(option['label'])}</option>\n"
            )
        if group_name:
            parts.append("\n  </optgroup>")
    parts.append("\n</select>")
    return mark_safe("".join(parts))
