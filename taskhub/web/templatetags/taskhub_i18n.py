"""Django's `i18n` template library, but a `{% translate "text" %}` of a quoted string remembers what it gave in each
language. taskhub's templates load it (`{% load taskhub_i18n %}`) in place of Django's.

Django's node makes a lazy translation of the string, renders it, escapes it (a template's own string is safe, so
nothing changes) and undoes the doubled percent signs on every render: about 10 us (bench/pages.py, py-spy). An
inbox page of 50 cards has some 900 of them, the largest share of its template time after variables. What a quoted
string translates to depends only on the language, so each node keeps it per language. Anything else (a variable, a
filter, `noop`, `context`, `as`) is Django's node unchanged; tests/test_template_i18n.py renders every form both ways.
It is a library of its own rather than one registered as `i18n` over Django's: that is what Django's check
templates.W003 warns of.

A `{% blocktranslate %}` without `count` or `context` likewise keeps its message translated per language (Django's
node writes the message out of its tokens and asks gettext on every render); the values it puts in are rendered
each time, as Django's node renders them. A list page has one per row, Home some 45.
"""

from django import template
from django.template.base import Variable, render_value_in_context
from django.templatetags import i18n as djangos_i18n
from django.utils import translation
from django.utils.safestring import SafeString
from django.utils.translation import get_language

register = template.Library()
register.tags.update(djangos_i18n.register.tags)
register.filters.update(djangos_i18n.register.filters)


class TranslateNode(djangos_i18n.TranslateNode):
    def __init__(self, filter_expression, noop, asvar=None, message_context=None):
        super().__init__(filter_expression, noop, asvar=asvar, message_context=message_context)
        var = self.filter_expression.var
        self.quoted = (
            not noop
            and asvar is None
            and message_context is None
            and not self.filter_expression.filters
            and isinstance(var, Variable)
            and isinstance(var.literal, str)
        )
        self.by_language: dict[str | None, str] = {}

    def render(self, context):
        if not self.quoted:
            return super().render(context)
        language = get_language()
        value = self.by_language.get(language)
        if value is None:
            value = self.by_language[language] = super().render(context)
        return value


@register.tag("translate")
@register.tag("trans")
def do_translate(parser, token):
    node = djangos_i18n.do_translate(parser, token)
    return TranslateNode(node.filter_expression, node.noop, asvar=node.asvar, message_context=node.message_context)


class BlockTranslateNode(djangos_i18n.BlockTranslateNode):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.by_language: dict[str | None, tuple[str, list[str]]] = {}

    def render(self, context, nested=False):
        if self.plural or self.countervar or self.message_context:
            return super().render(context, nested)
        language = get_language()
        kept = self.by_language.get(language)
        if kept is None:
            singular, names = self.render_token_list(self.singular)
            kept = self.by_language[language] = (translation.gettext(singular), names)
        message, names = kept
        context.update({name: value.resolve(context) for name, value in self.extra_context.items()})
        default_value = context.template.engine.string_if_invalid
        data = {}
        for name in names:
            if name in context:
                value = context[name]
            else:
                value = default_value % name if "%s" in default_value else default_value
            data[name] = render_value_in_context(value, context)
        context.pop()
        try:
            result = message % data
        except (KeyError, ValueError):
            return super().render(context, nested)  # a translation that does not fit: Django's node says what then
        if self.asvar:
            context[self.asvar] = SafeString(result)
            return ""
        return result


@register.tag("blocktranslate")
@register.tag("blocktrans")
def do_block_translate(parser, token):
    node = djangos_i18n.do_block_translate(parser, token)
    return BlockTranslateNode(
        node.extra_context,
        node.singular,
        node.plural,
        node.countervar,
        node.counter,
        node.message_context,
        trimmed=node.trimmed,
        asvar=node.asvar,
        tag_name=node.tag_name,
    )
