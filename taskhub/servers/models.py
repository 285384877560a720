from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils.translation import gettext_lazy as _
from django.utils.translation import pgettext_lazy
from encrypted_fields.fields import EncryptedJSONField, EncryptedTextField

from taskhub.database.loading import LoadedPlainly
from taskhub.mcp.client import HttpTarget, OwnAnswers, ServerTarget, StdioTarget
from taskhub.mcp.secret_urls import with_secrets
from taskhub.servers.policy import server_address_policy

NAME_TAKEN = "server_name_taken"


class Transport(models.TextChoices):
    HTTP = "http", "Streamable HTTP"
    STDIO = "stdio", _("stdio subprocess")


MAX_ROOTS = 50
MAX_ROOT_URI_CHARS = 2000
MAX_ROOT_NAME_CHARS = 200


def validate_roots(value) -> None:
    """A server's roots: a list of {"uri": "file://…", "name"?: …} (the spec's roots are file:// URIs)."""
    if not isinstance(value, list):
        raise ValidationError("The roots must be a list.")
    if len(value) > MAX_ROOTS:
        raise ValidationError(f"At most {MAX_ROOTS} roots.")
    for root in value:
        uri = root.get("uri") if isinstance(root, dict) else None
        if not isinstance(uri, str) or not uri.startswith("file://") or len(uri) > MAX_ROOT_URI_CHARS:
            raise ValidationError(
                f"A root is a file:// URI of at most {MAX_ROOT_URI_CHARS} characters, not {uri!r:.80}."
            )
        if any(char.isspace() or not char.isprintable() for char in uri):
            raise ValidationError(f"A root's URI has no spaces or control characters: {repr(uri)[:80]}.")
        name = root.get("name", "")
        if not isinstance(name, str) or len(name) > MAX_ROOT_NAME_CHARS or not name.isprintable():
            raise ValidationError(f"A root's name is printable text of at most {MAX_ROOT_NAME_CHARS} characters.")


class Server(LoadedPlainly, models.Model):
    """A registered MCP server. Credentials (bearer token, extra headers, the URL's secret query values, stdio
    environment) are encrypted at rest.

    Encryption is django-fernet-encrypted-fields: Fernet with a key derived from SECRET_KEY and
    FIELD_ENCRYPTION_KEYS (settings.SALT_KEY); both rotate through lists (SECRET_KEY_FALLBACKS, older
    keys after the first). In the JSON fields the values are encrypted and the keys (header and
    variable names) are not.
    """

    # Unique among the servers in use (the constraint below): a removed server's name is free for a new server.
    name = models.CharField(max_length=100)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    # Without its secrets (a secret query value is ***; userinfo is moved into the headers): see servers.services.
    url = models.URLField(max_length=2000, blank=True, help_text="Streamable HTTP endpoint")
    url_secrets = EncryptedJSONField(
        default=dict, blank=True, help_text="HTTP: the secret query values of the URL, by parameter (encrypted)"
    )
    command = models.CharField(max_length=1000, blank=True, help_text="stdio: the program to start")
    args = models.JSONField(default=list, blank=True, help_text="stdio: its arguments")
    env = EncryptedJSONField(default=dict, blank=True, help_text="stdio: environment variables (encrypted)")
    headers = EncryptedJSONField(default=dict, blank=True, help_text="HTTP: extra headers (encrypted)")
    # The library stores an empty value as NULL.
    bearer_token = EncryptedTextField(null=True, blank=True, help_text="HTTP: bearer token (encrypted)")
    enabled = models.BooleanField(default=True)
    # HTTP: connected through OAuth (issue 33): requests carry the tokens kept on its ServerAuthorization row.
    oauth = models.BooleanField(default=False, help_text="HTTP: authorized through OAuth")
    # How its tokens are got: a person's Connect (authorization code, refreshed), or by taskhub itself with the client
    # id and secret kept on its ServerAuthorization (client credentials, issue 33 item 5).
    oauth_client_credentials = models.BooleanField(
        default=False, help_text="HTTP: OAuth tokens got with the client credentials grant, no person"
    )
    # With client credentials: the client authenticates with a private-key JWT (RFC 7523; the key kept on its
    # ServerAuthorization) rather than a secret. On the server row so that its target needs no query to know.
    oauth_client_private_key = models.BooleanField(
        default=False, help_text="HTTP: the client credentials are a private key (a JWT client assertion)"
    )
    # Overrides of the worker's defaults for this server (taskhub/worker/slots.py); empty: the settings' values.
    max_concurrent_jobs = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="jobs of this server one worker runs at once (default TASKHUB_MAX_JOBS_PER_SERVER)",
    )
    call_timeout_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(3600)],
        help_text="how long a launch waits for tools/call to answer (default TASKHUB_LAUNCH_TIMEOUT_SECONDS)",
    )
    question_wait_seconds = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(10), MaxValueValidator(86400)],
        help_text="how long a call waits for a person to answer a question the server asks in the middle of it"
        " (classic elicitation; default TASKHUB_QUESTION_WAIT_SECONDS); then the server is told it was cancelled",
    )

    # What taskhub answers the server's own requests with (2025 revisions): `roots/list` from these roots (a list of
    # {"uri": "file://…", "name": …}; none by default), and whether `sampling/createMessage` is refused outright.
    roots = models.JSONField(default=list, blank=True, validators=[validate_roots])
    sampling_declined = models.BooleanField(
        default=False, help_text="refuse sampling/createMessage outright (taskhub then does not offer sampling)"
    )

    capabilities = models.JSONField(default=dict, blank=True)
    tools = models.JSONField(default=list, blank=True)
    discovered_at = models.DateTimeField(null=True, blank=True)
    # Set while a discovery job is queued or running (the page shows "discovering…"); cleared by its outcome.
    discovery_pending_since = models.DateTimeField(null=True, blank=True)
    # Why the last discovery failed, for people; empty once one succeeds.
    discovery_error = models.TextField(blank=True)

    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    last_error_at = models.DateTimeField(null=True, blank=True)
    unreachable_since = models.DateTimeField(null=True, blank=True)

    # Who answers its requests: its approval policies (taskhub/approvals), which replaced its approver groups.

    # Removed by an admin (services.remove_server): never deleted, so its tasks, their requests and the audit
    # trail keep their server and its name; a removed server is disabled for good (no launch, poll or delivery).
    removed_at = models.DateTimeField(null=True, blank=True)
    removed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("name",)
        constraints = (
            models.CheckConstraint(
                condition=models.Q(transport=Transport.HTTP, url__gt="")
                | models.Q(transport=Transport.STDIO, command__gt=""),
                name="server_transport_has_endpoint",
                violation_error_message="An HTTP server needs a URL; a stdio server needs a command.",
            ),
            models.UniqueConstraint(
                fields=("name",),
                condition=models.Q(removed_at__isnull=True),
                name="server_name_unique_in_use",
                violation_error_code=NAME_TAKEN,
                violation_error_message="Server with this Name already exists.",
            ),
        )

    def __str__(self) -> str:
        return self.name

    @property
    def is_discovering(self) -> bool:
        return self.discovery_pending_since is not None

    @property
    def is_removed(self) -> bool:
        return self.removed_at is not None

    @property
    def is_reachable(self) -> bool:
        return self.unreachable_since is None

    @classmethod
    def named(cls, name: str) -> "Server | None":
        """The server people mean by this name: the one in use, else the last one removed under it."""
        return cls.objects.filter(name=name).order_by(models.F("removed_at").desc(nulls_first=True)).first()

    def to_target(self) -> ServerTarget:
        if self.transport == Transport.HTTP:
            return HttpTarget(
                url=with_secrets(self.url, dict(self.url_secrets or {})),
                headers=dict(self.headers or {}),
                bearer_token=self.bearer_token or None,
                address_policy=server_address_policy(),
                own_answers=self.own_answers(),
                auth=self.oauth_auth(),
            )
        return StdioTarget(
            command=self.command,
            args=tuple(self.args or ()),
            env=dict(self.env) if self.env else None,
            own_answers=self.own_answers(),
        )

    def oauth_auth(self):
        """The httpx2.Auth that sends this server the OAuth tokens kept for it (refreshing them, one process at a
        time), None when it is not connected through OAuth. No query: safe in async code."""
        if not self.oauth or self.transport != Transport.HTTP:
            return None
        from taskhub.servers.oauth_store import stored_authorization

        return stored_authorization(
            server_id=self.pk,
            resource=self.url,
            client_credentials=self.oauth_client_credentials,
            private_key=self.oauth_client_private_key,
        )

    def own_answers(self) -> OwnAnswers:
        roots = tuple(
            (str(root.get("uri", "")), str(root.get("name") or ""))
            for root in (self.roots if isinstance(self.roots, list) else [])
            if isinstance(root, dict) and root.get("uri")
        )
        return OwnAnswers(roots=roots, sampling=not self.sampling_declined)


class ServerAuthorization(models.Model):
    """An HTTP server's OAuth authorization (issue 33): the client's registration (a Client ID Metadata Document's
    URL, a dynamic registration's result or the id and secret an admin entered), what discovery found, the tokens
    and their expiry. Everything the authorization server or the admin gave is encrypted at rest like the server's
    own credentials (see Server); it is read only by taskhub.servers.oauth_store, never rendered, logged, exported
    or audited. Bound to one resource (the server's URL when it was authorized): tokens go only there.

    One row per server, locked (SELECT ... FOR UPDATE) by whoever refreshes, so that one refresh at a time runs
    per server across all processes and the others use the token it stored."""

    server = models.OneToOneField(Server, primary_key=True, on_delete=models.CASCADE, related_name="authorization")
    resource = models.URLField(max_length=2000, help_text="the resource the tokens were issued for")
    client_info = EncryptedJSONField(default=dict, blank=True, help_text="the client's registration (encrypted)")
    # {"pem": …, "algorithm": …}: a client-credentials client's private key, for its JWT client assertions.
    client_key = EncryptedJSONField(default=dict, blank=True, help_text="the client's private key (encrypted)")
    discovery = EncryptedJSONField(default=dict, blank=True, help_text="the discovered metadata (encrypted)")
    tokens = EncryptedJSONField(default=dict, blank=True, help_text="access and refresh token, scopes (encrypted)")
    # When the access token expires (epoch seconds, as the SDK counts); NULL: it did not say.
    expires_at = models.FloatField(null=True, blank=True)
    # Set when a refresh failed (or a wider scope is needed): a person must connect the server again.
    needs_reauthorization_since = models.DateTimeField(null=True, blank=True)
    # The scope to ask for at the next connect (a 403 insufficient_scope's wider one), not secret.
    wanted_scope = models.CharField(max_length=2000, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __repr__(self) -> str:
        return f"<ServerAuthorization server={self.server_id}>"

    def __str__(self) -> str:
        return f"authorization of server {self.server_id}"


class ProcessState(models.TextChoices):
    STARTING = "starting", pgettext_lazy("process state", "starting")
    RUNNING = "running", pgettext_lazy("process state", "running")
    RESTARTING = "restarting", pgettext_lazy("process state", "exited, restarting")
    STOPPED = "stopped", pgettext_lazy("process state", "stopped")


# The last lines a stdio server wrote on stderr, kept for its page (redacted, each line capped).
STDERR_TAIL_LINES = 30
STDERR_TAIL_LINE_CHARS = 2000


class ServerProcess(models.Model):
    """The one long-lived process of a stdio server, and the lease that says which worker owns it.

    Exactly one worker holds an unexpired lease on a stdio server (taskhub/worker/stdio/leases.py): it runs the
    server's process, every job on the server (their procrastinate queue, `servers.hooks.job_queue`) and the
    tracker's polls of its tasks. The lease owner is the worker id, as in the tracker's task leases. The rest is
    what the server page shows of the process, written by its owner."""

    server = models.OneToOneField(Server, primary_key=True, on_delete=models.CASCADE, related_name="process")
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=12, choices=ProcessState.choices, default=ProcessState.STOPPED)
    pid = models.PositiveIntegerField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    restarts = models.PositiveIntegerField(default=0)
    next_start_at = models.DateTimeField(null=True, blank=True)
    last_exit = models.CharField(max_length=200, blank=True)
    last_exit_at = models.DateTimeField(null=True, blank=True)
    stderr_tail = models.JSONField(default=list, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"process of server {self.server_id} ({self.state})"
