# taskhub: one image for both processes (the README's production commands; compose.yaml runs them together).
#   web:    docker run … taskhub                          (daphne taskhub.asgi:application on :8000)
#   worker: docker run … taskhub python manage.py worker
# Configuration is the environment (README: Configuration): DATABASE_URL, REDIS_URL, SECRET_KEY, ALLOWED_HOSTS, …
# The OTLP trace exporter is in the image: OTEL_EXPORTER_OTLP_ENDPOINT alone turns traces on (README: Tracing).
# The one HEALTHCHECK serves both: a worker touches its health file (taskhub/worker/health.py), so where that file
# exists the check is the worker's, else it is the web process's /healthz, which answers whatever ALLOWED_HOSTS is.

FROM python:3.12-slim AS build
COPY --from=ghcr.io/astral-sh/uv:0.13 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
WORKDIR /app
# Dependencies first, so code changes reuse this layer.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --extra otlp --no-install-project
COPY . .
# Static files are collected and the code compiled here: at run time nothing under /app is written.
RUN uv sync --frozen --no-dev --extra otlp \
    && DEBUG=false SECRET_KEY=collectstatic-only .venv/bin/python manage.py collectstatic --noinput \
    && .venv/bin/python -m compileall -q manage.py taskhub

FROM python:3.12-slim
RUN useradd --system --uid 10001 --create-home --home-dir /home/taskhub taskhub
WORKDIR /app
# Owned by root (no --chown): the runtime user reads and runs the code and static files, and cannot change them.
COPY --from=build /app /app
ENV PATH="/app/.venv/bin:$PATH" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=taskhub.settings \
    TASKHUB_WORKER_HEALTH_FILE=/tmp/taskhub-worker.health
USER taskhub
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s CMD ["taskhub", "healthcheck"]
CMD ["daphne", "--bind", "0.0.0.0", "--port", "8000", "taskhub.asgi:application"]
