"""Django settings for the tests: taskhub's own, with what a test run needs and nothing else changed."""

import os

# Tests run with DEBUG off (like production) and need no real secret.
os.environ.setdefault("SECRET_KEY", "taskhub-tests-only-not-secret")
# The test client speaks plain HTTP; the HTTPS-only production settings are tested in test_settings.py.
os.environ.setdefault("HTTPS_ONLY", "false")

# The workers' long waits, made short (taskhub/settings.py explains each). Set in the environment, so the worker and
# daphne subprocesses that tests start inherit them. A killed worker is found dead after 6 s (its leases and jobs move
# on the next beat of another); the once-a-minute stalled-job sweep is only a safety net, left as in production. An
# answer a live worker was cut off sending is sent again 10.5 s after that attempt at the earliest (the delivery
# tests hold a tasks/update for at most 6 s); a dead worker's, 2 s (the production grace) after its death was found.
# The recovery-time tests run their workers with production's times instead (stack_fixtures.production_timed_workers).
for name, value in {
    "TASKHUB_WORKER_HEARTBEAT_SECONDS": "1",
    "TASKHUB_STALLED_WORKER_SECONDS": "6",
    "TASKHUB_DELIVERY_TIMEOUT_SECONDS": "9",
    "TASKHUB_DELIVERY_SETTLE_SECONDS": "10.5",
    "TASKHUB_POLL_BACKOFF_CAP_SECONDS": "2",
    "TASKHUB_AUTHORIZATION_WAIT_SECONDS": "1",
}.items():
    os.environ.setdefault(name, value)

from taskhub.settings import *  # noqa: E402, F403

# The manifest storage needs `collectstatic`; tests render templates without running it.
STORAGES = {**STORAGES, "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}  # noqa: F405

# Hashing a password the production way takes ~0.3 s, and many tests sign in. A test whose user signs in to a web
# process it started (which runs taskhub.settings) hashes as production does: see conftest.py.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# The audit table refuses TRUNCATE (audit migration 0006) unless the session opts in; transactional tests end with
# Django's flush, which empties every table with TRUNCATE. Only the test process's own connections opt in
# (subprocesses started by tests run taskhub.settings, as production does); tests/test_audit.py turns it off to
# check the refusal.
_test_database_options = DATABASES["default"].setdefault("OPTIONS", {})  # noqa: F405
_test_database_options["options"] = (
    _test_database_options.get("options", "") + " -c taskhub.allow_audit_truncate=on"
).strip()
