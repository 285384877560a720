"""The add/edit form of a server. Credentials are write-only: never rendered back, not even after an error.

- bearer token: a password box, blank keeps the stored one, "remove" clears it;
- extra headers (`Name: value` lines) and stdio environment (`NAME=value` lines): what is typed sets or
  replaces those names; the names already set are listed (never their values) with a checkbox each to
  remove them.
Error messages name a line by its number, never by its content (it may hold a secret).
"""

import re

from django import forms
from django.core.exceptions import ValidationError
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from taskhub.acyclic_forms import AcyclicModelChoiceField
from taskhub.mcp.secret_urls import has_secrets, mask_url
from taskhub.servers.models import Server, Transport, validate_roots

HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_HEADERS = {"authorization", "content-type", "accept", "content-length", "host", "mcp-session-id"}


class MaskedUrlInput(forms.URLInput):
    """A URL box that shows the URL's secrets (userinfo password, secret query values) as ***, even after an
    error; a *** sent back keeps the stored value (servers.services)."""

    def format_value(self, value):
        return mask_url(value) if value else value


class SecretLines(forms.Textarea):
    """A textarea that never shows what it holds: a re-rendered form starts it empty."""

    def format_value(self, value):
        return None

    def get_context(self, name, value, attrs):
        return super().get_context(name, None, attrs)


def _lines(text: str):
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            yield number, line


def parse_headers(text: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    problems = []
    for number, line in _lines(text):
        name, colon, value = line.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not name:
            problems.append(gettext("Line %(number)s is not of the form “Name: value”.") % {"number": number})
        elif not HEADER_NAME.match(name):
            problems.append(
                gettext("Line %(number)s: a header name has only letters, digits and - _ . (no spaces).")
                % {"number": number}
            )
        elif name.lower() in RESERVED_HEADERS:
            said = (
                gettext("Line %(number)s: the %(name)s header is set by the bearer token field.")
                if name.lower() == "authorization"
                else gettext("Line %(number)s: the %(name)s header is set by taskhub itself.")
            )
            problems.append(said % {"number": number, "name": name})
        elif not value:
            problems.append(
                gettext("Line %(number)s: the header %(name)s has no value.") % {"number": number, "name": name}
            )
        else:
            headers[name] = value
    if problems:
        raise forms.ValidationError(problems)
    return headers


def parse_env(text: str) -> dict[str, str]:
    env: dict[str, str] = {}
    problems = []
    for number, line in _lines(text):
        name, equals, value = line.partition("=")
        name = name.strip()
        if not equals or not name:
            problems.append(gettext("Line %(number)s is not of the form “NAME=value”.") % {"number": number})
        elif not ENV_NAME.match(name):
            problems.append(
                gettext("Line %(number)s: a variable name has only letters, digits and _, not first a digit.")
                % {"number": number}
            )
        else:
            env[name] = value
    if problems:
        raise forms.ValidationError(problems)
    return env


class ServerForm(forms.Form):
    name = forms.CharField(max_length=100, label=_("Name"), help_text=_("How people will see this server in taskhub."))
    transport = forms.ChoiceField(
        label=_("Transport"),
        choices=[(Transport.HTTP, "Streamable HTTP"), (Transport.STDIO, _("stdio (a program taskhub starts)"))],
        widget=forms.RadioSelect,
        initial=Transport.HTTP,
    )
    url = forms.CharField(
        label="URL",
        max_length=2000,
        required=False,
        help_text=_(
            "The Streamable HTTP endpoint, e.g. https://mcp.example.com/mcp. A user:password@ in it is stored as an"
            " encrypted Basic authorization header; secret query values (token, api_key, …) are stored encrypted"
            " and shown as ***."
        ),
        widget=MaskedUrlInput(attrs={"placeholder": "https://…/mcp", "spellcheck": "false"}),
    )
    command = forms.CharField(
        max_length=1000,
        required=False,
        label=_("Command"),
        help_text=_("The program to start, e.g. /usr/bin/python3 or npx."),
        widget=forms.TextInput(attrs={"spellcheck": "false"}),
    )
    args = forms.CharField(
        label=_("Arguments"),
        required=False,
        help_text=_("One argument per line, as the program receives it (no shell quoting)."),
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
    )
    enabled = forms.BooleanField(
        required=False, initial=True, label=_("Enabled"), help_text=_("Operators launch tools only on enabled servers.")
    )
    max_concurrent_jobs = forms.IntegerField(
        label=_("Max concurrent jobs"),
        required=False,
        min_value=1,
        max_value=1000,
        help_text=_(
            "How many of this server's launches, answers and cancels one worker runs at once. Empty: the"
            " worker's default (TASKHUB_MAX_JOBS_PER_SERVER, a quarter of its job slots)."
        ),
    )
    call_timeout_seconds = forms.IntegerField(
        label=_("Call timeout (seconds)"),
        required=False,
        min_value=1,
        max_value=3600,
        help_text=_(
            "How long a launch waits for the tool call to answer. Empty: TASKHUB_LAUNCH_TIMEOUT_SECONDS (120)."
        ),
    )
    question_wait_seconds = forms.IntegerField(
        label=_("Question wait (seconds)"),
        required=False,
        min_value=10,
        max_value=86400,
        help_text=_(
            "How long a call waits for a person to answer a question the server asks in the middle of it"
            " (classic elicitation); the time does not count against the call timeout. Then the server is told the"
            " question was cancelled. Empty: TASKHUB_QUESTION_WAIT_SECONDS (600)."
        ),
    )
    roots = forms.CharField(
        label=_("Roots"),
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "spellcheck": "false"}),
        help_text=_(
            "What taskhub answers when the server asks for the client's roots (roots/list, 2025 revisions): one"
            " file:// URI per line, optionally followed by a space and a name, e.g. file:///srv/repo Repository."
            " Empty: no roots. A new list is announced at once to the server's open sessions."
        ),
    )
    sampling_declined = forms.BooleanField(
        label=_("Decline sampling"),
        required=False,
        help_text=_(
            "Refuse sampling/createMessage outright. Otherwise a server that asks for a model's message in the"
            " middle of a call gets one written by a person, in the inbox like any other request."
        ),
    )
    bearer_token = forms.CharField(
        required=False,
        strip=True,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        label=_("Bearer token"),
        help_text=_("HTTP: sent as “Authorization: Bearer …”."),
    )
    remove_bearer_token = forms.BooleanField(required=False, label=_("Remove the stored token"))
    headers = forms.CharField(
        label=_("Extra HTTP headers"),
        required=False,
        strip=False,
        widget=SecretLines(attrs={"rows": 3, "spellcheck": "false", "autocomplete": "off"}),
        help_text=_("One “Name: value” per line, e.g. X-Api-Key: …"),
    )
    remove_headers = forms.MultipleChoiceField(
        label=_("Remove headers"), required=False, widget=forms.CheckboxSelectMultiple, choices=()
    )
    env = forms.CharField(
        label=_("Environment"),
        required=False,
        strip=False,
        widget=SecretLines(attrs={"rows": 3, "spellcheck": "false", "autocomplete": "off"}),
        help_text=_("stdio: one NAME=value per line, added to the program's environment."),
    )
    remove_env = forms.MultipleChoiceField(
        label=_("Remove variables"), required=False, widget=forms.CheckboxSelectMultiple, choices=()
    )

    def __init__(self, *args, server: Server | None = None, **kwargs):
        self.server = server
        if server is not None and "initial" not in kwargs:
            kwargs["initial"] = {
                "name": server.name,
                "transport": server.transport,
                "url": server.url,
                "command": server.command,
                "args": "\n".join(str(arg) for arg in server.args or []),
                "enabled": server.enabled,
                "max_concurrent_jobs": server.max_concurrent_jobs,
                "call_timeout_seconds": server.call_timeout_seconds,
                "question_wait_seconds": server.question_wait_seconds,
                "roots": "\n".join(
                    f"{root.get('uri', '')} {root.get('name', '')}".rstrip() for root in server.roots or []
                ),
                "sampling_declined": server.sampling_declined,
            }
        super().__init__(*args, **kwargs)
        self.stored_headers = sorted((server.headers or {}) if server else {})
        self.stored_env = sorted((server.env or {}) if server else {})
        self.has_token = bool(server and server.bearer_token)
        self.fields["remove_headers"].choices = [(name, name) for name in self.stored_headers]
        self.fields["remove_env"].choices = [(name, name) for name in self.stored_env]
        if server is not None:
            self.fields["bearer_token"].help_text = (
                gettext("A token is stored; leave blank to keep it, or type a new one to replace it.")
                if self.has_token
                else gettext("No token is stored.") + " " + str(self.fields["bearer_token"].help_text)
            )
            already_set = gettext("A name already set gets the new value.")
            self.fields["headers"].help_text = f"{self.fields['headers'].help_text} {already_set}"
            self.fields["env"].help_text = f"{self.fields['env'].help_text} {already_set}"

    def clean_headers(self):
        return parse_headers(self.cleaned_data.get("headers", ""))

    def clean_env(self):
        return parse_env(self.cleaned_data.get("env", ""))

    def clean_roots(self):
        roots = []
        for line in self.cleaned_data.get("roots", "").splitlines():
            uri, _, name = line.strip().partition(" ")
            if uri:
                roots.append({"uri": uri, **({"name": name.strip()} if name.strip() else {})})
        try:
            validate_roots(roots)
        except ValidationError as error:
            raise forms.ValidationError(error.messages) from None
        return roots

    def clean_args(self):
        return [line.strip() for line in self.cleaned_data.get("args", "").splitlines() if line.strip()]

    def clean(self):
        data = super().clean()
        transport = data.get("transport")
        if transport == Transport.HTTP and not data.get("url"):
            self.add_error("url", gettext("A Streamable HTTP server needs its URL."))
        if transport == Transport.STDIO and not data.get("command"):
            self.add_error("command", gettext("A stdio server needs the command that starts it."))
        if data.get("bearer_token") and data.get("remove_bearer_token"):
            self.add_error(
                "remove_bearer_token", gettext("Either type a new token or remove the stored one, not both.")
            )
        return data

    @property
    def secrets_were_typed(self) -> bool:
        """After an error: the secret boxes come back empty, so the page asks to type them again."""
        typed = any(self.data.get(name) for name in ("bearer_token", "headers", "env"))
        return self.is_bound and (typed or has_secrets(self.data.get("url") or ""))

    def service_arguments(self) -> dict:
        """Keyword arguments for create_server / update_server; secrets only when they change."""
        data = self.cleaned_data
        arguments = {
            "name": data["name"],
            "transport": data["transport"],
            "url": data["url"],
            "command": data["command"],
            "args": data["args"],
            "enabled": data["enabled"],
            "max_concurrent_jobs": data["max_concurrent_jobs"],
            "call_timeout_seconds": data["call_timeout_seconds"],
            "question_wait_seconds": data["question_wait_seconds"],
            "roots": data["roots"],
            "sampling_declined": data["sampling_declined"],
        }
        if self.server is None:
            arguments.update(headers=data["headers"], env=data["env"], bearer_token=data["bearer_token"] or None)
            return arguments
        headers = {k: v for k, v in (self.server.headers or {}).items() if k not in data["remove_headers"]}
        headers.update(data["headers"])
        if headers != (self.server.headers or {}):
            arguments["headers"] = headers
        env = {k: v for k, v in (self.server.env or {}).items() if k not in data["remove_env"]}
        env.update(data["env"])
        if env != (self.server.env or {}):
            arguments["env"] = env
        if data["bearer_token"]:
            arguments["bearer_token"] = data["bearer_token"]
        elif data["remove_bearer_token"] and self.server.bearer_token:
            arguments["bearer_token"] = None
        return arguments


class ServersInOneRead(forms.models.ModelChoiceIterator):
    """The choices read with one SELECT, of the columns a choice shows. Django's iterator reads them through
    queryset.iterator(), which on Postgres is a server-side cursor: DECLARE … WITH HOLD, FETCH and CLOSE, three round
    trips for a few dozen servers, about 2 ms of the task list's filter bar (bench/pages.py); and every column, a
    server's catalogue and its three encrypted ones decrypted, for each server offered."""

    def __iter__(self):
        if self.field.empty_label is not None:
            yield ("", self.field.empty_label)
        for obj in self.queryset.only(*CHOICE_SHOWS):
            yield self.choice(obj)


# What a choice of server shows (ServerChoiceField.label_from_instance, InUseServerSelect).
CHOICE_SHOWS = ("pk", "name", "removed_at")


class ServerChoiceField(AcyclicModelChoiceField):
    """A choice of server that names a removed one as such (its name may have been taken by a new server)."""

    iterator = ServersInOneRead

    def label_from_instance(self, obj: Server) -> str:
        return gettext("%(server)s (removed)") % {"server": obj.name} if obj.removed_at is not None else obj.name


class InUseServerSelect(forms.Select):
    """Offers the servers in use; a removed server only when it is the chosen one (a link from its page)."""

    def optgroups(self, name, value, attrs=None):
        groups = []
        for group_name, options, index in super().optgroups(name, value, attrs):
            options = [option for option in options if option["selected"] or not _removed(option["value"])]
            if options:
                groups.append((group_name, options, index))
        return groups


def _removed(value) -> bool:
    server = getattr(value, "instance", None)
    return server is not None and server.removed_at is not None


class ServerFilterField(ServerChoiceField):
    """A filter by server (task list, inbox): any server of its queryset is a valid value (a removed server's tasks
    stay readable), but a removed one is not offered in the list unless chosen."""

    widget = InUseServerSelect
