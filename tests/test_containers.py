"""The container setup as written (issue 20 item 2): the Dockerfile's health check and compose.yaml's services.

No Docker engine here: the image is not built. What the image would run is run instead: the very HEALTHCHECK
command of the Dockerfile against a production-settings daphne whose ALLOWED_HOSTS does not name 127.0.0.1, and
against a running `manage.py worker`; it must fail once each is stopped. The same daphne checks that a refused
request logs one line without a traceback (issue 15 item 9).
"""

import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
import yaml

from taskhub.accounts.groups import APPROVERS
from tests.account_fixtures import make_user
from tests.browser_fixtures import running_daphne
from tests.conftest import PROJECT_DIR, VENV_BIN
from tests.helpers import free_port, wait_until
from tests.stack_fixtures import Workers, production_environment, session_cookie_for, worker_environment

DOCKERFILE = (PROJECT_DIR / "Dockerfile").read_text()
COMPOSE = yaml.safe_load((PROJECT_DIR / "compose.yaml").read_text())
PRODUCTION_HOST = "hub.example.com"
TASKHUB_SERVICES = ("migrate", "web", "worker", "demo")


def dockerfile_json_instruction(name: str) -> list[str]:
    """The exec form (a JSON array) of the final stage's CMD, or of HEALTHCHECK's CMD."""
    final_stage = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    line = next(line for line in final_stage.splitlines() if line.startswith(f"{name} "))
    return json.loads(line.split("CMD ", 1)[1] if name == "HEALTHCHECK" else line.removeprefix("CMD "))


HEALTHCHECK = dockerfile_json_instruction("HEALTHCHECK")


def run_healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess:
    """The Dockerfile's HEALTHCHECK command, as the image runs it (its console script on PATH)."""
    env = {**env, "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"}
    return subprocess.run(HEALTHCHECK, cwd=PROJECT_DIR, env=env, capture_output=True, text=True, timeout=30)


# --- the files as written ------------------------------------------------------------------------------------


def test_the_image_runs_as_a_user_that_cannot_change_its_code_or_static_files():
    build_stage, final_stage = DOCKERFILE.split("\nFROM ", 2)[1:]
    assert "collectstatic" in build_stage and "collectstatic" not in final_stage
    copies = [line for line in final_stage.splitlines() if line.startswith("COPY")]
    assert copies == ["COPY --from=build /app /app"], "no --chown: root owns /app"
    user = next(line for line in final_stage.splitlines() if line.startswith("USER "))
    assert user.split()[1] not in ("root", "0")
    assert final_stage.index("USER ") > final_stage.index("COPY ")
    assert HEALTHCHECK[0] == "taskhub" and "TASKHUB_WORKER_HEALTH_FILE=/tmp/" in final_stage


def test_compose_runs_the_readme_deployment_with_the_images_commands_and_health_checks():
    services = COMPOSE["services"]
    assert set(services) == {"postgres", "redis", *TASKHUB_SERVICES}
    for name in TASKHUB_SERVICES:
        assert services[name]["build"] == "." and services[name]["image"] == "taskhub"
    web, worker = services["web"], services["worker"]
    assert web["deploy"]["replicas"] == 2 and worker["deploy"]["replicas"] == 2
    # The web processes run the image's CMD, the workers the README's worker command, and both keep the image's
    # HEALTHCHECK (the one tested below), which tells a worker from a web process by the worker's health file.
    assert "command" not in web
    assert dockerfile_json_instruction("CMD")[:1] == ["daphne"]
    assert worker["command"] == ["python", "manage.py", "worker"]
    assert "manage.py worker" in (PROJECT_DIR / "README.md").read_text()
    assert "healthcheck" not in web and "healthcheck" not in worker
    for name in ("web", "worker"):
        environment = services[name]["environment"]
        assert {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS"} <= set(environment)
        assert "TASKHUB_WORKER_HEALTH_FILE" not in environment  # the image's own, so the check finds it
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    # Two database roles (taskhub/database/roles.py): migrate runs as the owner and grants the one the others use.
    migrate_environment = services["migrate"]["environment"]
    app_role = migrate_environment["TASKHUB_DATABASE_APP_ROLE"]
    assert migrate_environment["TASKHUB_DATABASE_APP_PASSWORD"]
    owner = urlsplit(migrate_environment["DATABASE_URL"]).username
    assert owner == services["postgres"]["environment"]["POSTGRES_USER"] != app_role
    for name in ("web", "worker"):
        assert urlsplit(services[name]["environment"]["DATABASE_URL"]).username == app_role
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    demo = services["demo"]["command"]
    assert demo[:3] == ["python", "-m", "taskhub.demo"] and "--http" in demo


@pytest.mark.django_db
def test_healthz_answers_a_host_that_is_not_allowed_as_an_anonymous_request_and_only_healthz(
    client, settings, django_user_model
):
    settings.ALLOWED_HOSTS = [PRODUCTION_HOST]
    client.force_login(django_user_model.objects.create_superuser(username="root", password=None))
    by_address = client.get("/healthz", headers={"Host": "10.0.0.5:8000"})
    assert by_address.status_code == 200 and by_address.json()["status"] == "ok"
    assert "version" not in by_address.json()["database"]  # not the admin's answer: the Host is not trusted
    assert client.get("/healthz", headers={"Host": PRODUCTION_HOST}).json()["database"]["version"]
    assert client.post("/healthz", headers={"Host": "10.0.0.5"}).status_code == 405
    assert client.get("/", headers={"Host": "10.0.0.5"}).status_code == 400
    assert client.get("/healthz/", headers={"Host": "10.0.0.5"}).status_code == 400


# --- the health check against real processes ---------------------------------------------------------------


@pytest.fixture(scope="module")
def production_env(tmp_path_factory, django_db_setup, django_db_blocker):
    # Text logs, so that a traceback would show as lines of its own. The health file named as in the image, but
    # for this module alone. Nothing listens at the web check's address unless a test says where daphne is.
    directory = tmp_path_factory.mktemp("production")
    with django_db_blocker.unblock():  # collectstatic runs on the test database's settings
        return production_environment(
            directory / "static",
            ALLOWED_HOSTS=PRODUCTION_HOST,
            LOG_FORMAT="text",
            TASKHUB_WORKER_HEALTH_FILE=str(directory / "taskhub-worker.health"),
            TASKHUB_HEALTHCHECK_URL=f"http://127.0.0.1:{free_port()}/healthz",
        )


def get(url: str, *, host: str = PRODUCTION_HOST, cookie: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Host": host, **({"Cookie": cookie} if cookie else {})})
    try:
        with urllib.request.urlopen(request, timeout=15) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_web_health_check_passes_whatever_allowed_hosts_says_and_refusals_log_one_line(
    production_env, settings, production_password_hashers
):
    settings.SECRET_KEY = production_env["SECRET_KEY"]  # the session made here must be valid in daphne
    approver = make_user("arun", APPROVERS)
    with running_daphne(**production_env) as web:
        env = {**worker_environment(**production_env), "TASKHUB_HEALTHCHECK_URL": f"{web.url}/healthz"}
        checked = run_healthcheck(env)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert "web: healthy" in checked.stdout
        # Only /healthz skips the Host check: any other page still refuses a Host that is not allowed.
        assert get(f"{web.url}/accounts/login/", host="127.0.0.1") == 400
        assert get(f"{web.url}/accounts/login/") == 200

        cookie = f"{settings.SESSION_COOKIE_NAME}={session_cookie_for(approver)}"
        refusals = {"/servers/": 403, "/no-such-page/": 404}
        for path, status in refusals.items():
            assert get(f"{web.url}{path}", cookie=cookie) == status
        log = wait_until(
            lambda: (text := web.log_path.read_text()).count("/no-such-page/") and text, what="the 404's log line"
        )
    checked = run_healthcheck(env)
    assert checked.returncode == 1 and "web: unhealthy" in checked.stdout, checked.stdout

    assert "Traceback" not in log, log
    for line in (
        "WARNING django.security.DisallowedHost: Invalid HTTP_HOST header: '127.0.0.1'",
        "Forbidden (Permission denied): /servers/",
    ):
        assert len([logged for logged in log.splitlines() if line in logged]) == 1, log
    assert len(re.findall(r"Not Found: /no-such-page/", log)) == 1, log


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_worker_health_check_follows_the_workers_heartbeat(production_env):
    env = worker_environment(**production_env, TASKHUB_WORKER_HEALTH_SECONDS="0.5")
    workers = Workers(env)
    try:
        worker = workers.start("health")

        def check_says(code: int):
            checked = run_healthcheck(env)
            return checked if checked.returncode == code else None

        healthy = wait_until(lambda: check_says(0), what="a healthy worker", timeout=60)
        assert "worker: healthy" in healthy.stdout
        # A hung worker (stopped by SIGSTOP) touches nothing: unhealthy within three beats; well again once it runs.
        worker.send_signal(signal.SIGSTOP)
        hung = wait_until(lambda: check_says(1), what="the hung worker found unhealthy")
        assert "worker: unhealthy" in hung.stdout and "ago" in hung.stdout
        worker.send_signal(signal.SIGCONT)
        wait_until(lambda: check_says(0), what="the worker healthy again")
        # A stopped worker removes its health file: the check fails at once.
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        stopped = run_healthcheck(env)
        assert stopped.returncode == 1, stopped.stdout
        assert "web: unhealthy" in stopped.stdout  # no health file: nothing says this is a worker any more
    finally:
        workers.stop_all()
