"""Two of Django's template builtins, `{% url %}` and `|truncatechars`, giving the same output for less: every
template has them (settings.TEMPLATES' `builtins` puts this library after Django's own, so its names win).

`{% url %}` reverses through Django's resolver on every render: about 20 us here, three times a card of the inbox
and once a row of the task list (bench/pages.py). A node whose view name is quoted and whose arguments are UUIDs or
whole numbers ≥ 0 (what taskhub's URLs take) keeps the URL it reversed with stand-in arguments, per resolver, script
prefix, current app and language, and puts each render's arguments where the stand-ins were. Anything else (keyword
arguments, text, a view name from a variable) is Django's node unchanged, as is an arguments' shape whose URL does
not show the stand-ins as they went in (a converter that rewrites them).

`|truncatechars` walks every character of the text to count the combining ones and normalises it to NFC first,
about 12 us on a status message that fits. ASCII text (no combining characters, NFC already) that fits is returned
as it is, which is what Django's filter returns for it; anything else goes to Django's filter.

tests/test_template_builtins.py holds both to Django's output.
"""

import uuid

from django import template
from django.template import defaultfilters
from django.template.defaulttags import URLNode
from django.template.defaulttags import url as djangos_url
from django.urls import NoReverseMatch, get_resolver, get_script_prefix, get_urlconf, reverse
from django.utils.html import conditional_escape
from django.utils.translation import get_language

register = template.Library()

# Stand-ins nobody's URL holds, and that a converter rewriting its value (upper case, no dashes…) would not leave as
# they are: the URL made with them is only kept when each shows in it exactly once.
_UUID_STAND_INS = tuple(uuid.UUID(f"abcdef{n:02d}-cdef-4abc-8def-abcdefabcdef") for n in range(4))
_INT_STAND_INS = tuple(9_182_736_450_000 + n for n in range(4))
_NOT_KEPT = object()


class KeptURLNode(URLNode):
    """Django's URLNode that remembers what it reversed (see the module's docstring)."""

    def __init__(self, view_name, args, kwargs, asvar):
        super().__init__(view_name, args, kwargs, asvar)
        # A quoted view name is a constant: the parser has made it a string already (a variable stays a Variable).
        quoted = isinstance(view_name.var, str) and not view_name.filters
        self.quoted_view_name = str(view_name.var) if quoted and not kwargs and len(args) <= 4 else None
        self.kept: dict[tuple, tuple[str | int, ...] | object] = {}

    def render(self, context):
        if self.quoted_view_name is None:
            return super().render(context)
        args = [arg.resolve(context) for arg in self.args]
        shape = tuple(_kind(arg) for arg in args)
        if None in shape:
            return super().render(context)
        current_app = _current_app(context)
        key = (shape, get_resolver(get_urlconf()), get_script_prefix(), current_app, get_language())
        pieces = self.kept.get(key)
        if pieces is None:
            pieces = self.kept[key] = _url_pieces(self.quoted_view_name, shape, current_app)
        if pieces is _NOT_KEPT:
            return super().render(context)
        url = "".join(piece if type(piece) is str else str(args[piece]) for piece in pieces)
        if self.asvar:
            context[self.asvar] = url
            return ""
        return conditional_escape(url) if context.autoescape else url


def _kind(arg) -> str | None:
    if isinstance(arg, uuid.UUID):
        return "uuid"
    if type(arg) is int and arg >= 0:  # not bool, not a subclass with its own str()
        return "int"
    return None


def _stand_in(kind: str, index: int):
    return _UUID_STAND_INS[index] if kind == "uuid" else _INT_STAND_INS[index]


def _current_app(context):
    # As URLNode.render finds it.
    try:
        return context.request.current_app
    except AttributeError:
        try:
            return context.request.resolver_match.namespace
        except AttributeError:
            return None


def _url_pieces(view_name: str, shape: tuple[str, ...], current_app) -> tuple[str | int, ...] | object:
    """The URL reversed with stand-ins, cut where they stand: its text, and in between the index of the argument that
    goes there."""
    stand_in_args = [_stand_in(kind, index) for index, kind in enumerate(shape)]
    try:
        url = reverse(view_name, args=stand_in_args, current_app=current_app)
    except NoReverseMatch:
        return _NOT_KEPT  # Django's node says why, on this render and each after
    stand_ins = [str(arg) for arg in stand_in_args]
    if any(url.count(stand_in) != 1 for stand_in in stand_ins):
        return _NOT_KEPT
    where = sorted((url.index(stand_in), index) for index, stand_in in enumerate(stand_ins))
    pieces: list[str | int] = []
    start = 0
    for position, index in where:
        pieces += [url[start:position], index]
        start = position + len(stand_ins[index])
    pieces.append(url[start:])
    return tuple(pieces)


@register.tag("url")
def url(parser, token):
    node = djangos_url(parser, token)
    return KeptURLNode(node.view_name, node.args, node.kwargs, node.asvar)


@register.filter(is_safe=True)
def truncatechars(value, arg):
    if type(value) is str and value.isascii():
        try:
            length = int(arg)
        except ValueError:
            return value
        if length > 0 and len(value) <= length:
            return value
    return defaultfilters.truncatechars(value, arg)
