"""Credentials in URLs: the one place that knows which parts of a URL are secret and how a URL is shown.

A secret in a URL is the password of its userinfo (`http://user:secret@host/`) and the value of a query parameter
whose name says it is one, by rule (`?token=…`, `?access_key=…`, `?Subscription-Key=…`, `?sig=…`: any name that
contains key, token, secret, sig, pass, auth or credential, in any case, `-` read as `_`; see
:func:`is_secret_parameter`). Everything
that shows or records a URL (pages, audit rows, logs, errors) goes through :func:`mask_url` or, for free text
that may quote URLs (an exception's message), :func:`mask_urls_in`. Storage keeps a URL without its secrets
(:func:`split_secrets`) and the secrets encrypted elsewhere; :func:`with_secrets` puts them back for the wire.

No Django here: the protocol client masks the URLs in its own error messages and log lines.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"

# Parameter names (compared lower-cased, `-` read as `_`) whose value is a credential.
SECRET_PARAMETERS = frozenset(
    {
        "access_token",
        "api_key",
        "apikey",
        "auth",
        "auth_token",
        "authorization",
        "client_secret",
        "code",
        "credential",
        "credentials",
        "id_token",
        "jwt",
        "key",
        "pass",
        "passwd",
        "password",
        "pwd",
        "refresh_token",
        "secret",
        "session",
        "session_id",
        "sessionid",
        "sig",
        "signature",
        "token",
        "x_amz_credential",
        "x_amz_security_token",
        "x_amz_signature",
        "x_goog_signature",
    }
)
# …and any name containing one of these (issue 31, point 8: `access_key`, `subscription-key`, `private_key` and
# `auth_key` were shown in clear when only whole names were listed).
SECRET_NAME_PARTS = ("key", "token", "secret", "sig", "pass", "auth", "credential")

_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def is_secret_parameter(name: str) -> bool:
    normal = name.strip().lower().replace("-", "_")
    return normal in SECRET_PARAMETERS or any(part in normal for part in SECRET_NAME_PARTS)


def _netloc(host: str | None, port: int | None, username: str | None, password: str | None) -> str:
    host = host or ""
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    netloc = host + (f":{port}" if port is not None else "")
    if username is not None or password is not None:
        userinfo = quote(username or "", safe="") + (f":{password}" if password is not None else "")
        netloc = f"{userinfo}@{netloc}"
    return netloc


def mask_url(url: str) -> str:
    """`url` as it may be shown: the userinfo password and every secret query value replaced by ***.

    Something that does not parse as a URL is shown as *** whole (it cannot be told what in it is secret)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return MASK
    netloc = parts.netloc
    if parts.password is not None:
        netloc = _netloc(parts.hostname, port, parts.username, MASK)
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_parameter(name) for name, _ in pairs):
            query = urlencode([(n, MASK if is_secret_parameter(n) else v) for n, v in pairs], safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def mask_urls_in(text: str) -> str:
    """Free text (an error message, a log line) with every URL in it masked."""
    if "://" not in text:
        return text
    return _URL_IN_TEXT.sub(lambda match: mask_url(match.group(0)), text)


def has_secrets(url: str) -> bool:
    return mask_url(url) != url


def split_secrets(url: str) -> tuple[str, tuple[str, str] | None, dict[str, list[str]]]:
    """(the URL without userinfo and with every secret query value replaced by ***, the userinfo's
    (username, password) or None, {parameter: [values]} of the secret query values in order).

    A value already *** is left as it is (and not listed): an unchanged URL re-submitted from a form."""
    parts = urlsplit(url)
    userinfo = None
    netloc = parts.netloc
    if parts.username is not None or parts.password is not None:
        userinfo = (unquote(parts.username or ""), unquote(parts.password or ""))
        netloc = _netloc(parts.hostname, parts.port, None, None)
    secrets: dict[str, list[str]] = {}
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(is_secret_parameter(name) for name, _ in pairs):
            kept = []
            for name, value in pairs:
                if is_secret_parameter(name):
                    if value != MASK:
                        secrets.setdefault(name, []).append(value)
                    value = MASK
                kept.append((name, value))
            query = urlencode(kept, safe="*")
    return urlunsplit(parts._replace(netloc=netloc, query=query)), userinfo, secrets


def masked_parameters(url: str) -> list[str]:
    """The names of the query parameters whose value is *** in `url`, in order (one entry per occurrence)."""
    query = urlsplit(url).query
    return [name for name, value in parse_qsl(query, keep_blank_values=True) if value == MASK]


def with_secrets(url: str, secrets: dict[str, list[str]]) -> str:
    """The URL to send: each *** query value replaced by its parameter's next stored value."""
    if not secrets:
        return url
    parts = urlsplit(url)
    remaining = {name: list(values) for name, values in secrets.items()}
    pairs = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if value == MASK and remaining.get(name):
            value = remaining[name].pop(0)
        pairs.append((name, value))
    return urlunsplit(parts._replace(query=urlencode(pairs)))


class MaskUrlsInLogs(logging.Filter):
    """Masks the URLs in a library's log records (the SDK logs its endpoint, httpx2 every request's URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = mask_urls_in(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


def mask_urls_in_logs_of(*logger_names: str) -> None:
    for name in logger_names:
        target = logging.getLogger(name)
        if not any(isinstance(existing, MaskUrlsInLogs) for existing in target.filters):
            target.addFilter(MaskUrlsInLogs())
