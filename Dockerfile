# taskhub: one image for both processes (the README's production commands).
#   web:    docker run … taskhub                          (daphne taskhub.asgi:application on :8000)
#   worker: docker run … taskhub python manage.py worker
# Configuration is the environment (README: Configuration): DATABASE_URL, REDIS_URL, SECRET_KEY, ALLOWED_HOSTS, …

FROM python:3.12-slim AS build
COPY --from=ghcr.io/astral-sh/uv:0.13 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
WORKDIR /app
# Dependencies first, so code changes reuse this layer.
COPY pyproject.toml uv.lock README.md ./
RUN uv sync --frozen --no-dev --no-install-project
COPY . .
RUN uv sync --frozen --no-dev \
    && DEBUG=false SECRET_KEY=collectstatic-only .venv/bin/python manage.py collectstatic --noinput

FROM python:3.12-slim
RUN useradd --system --uid 10001 --home-dir /app taskhub
WORKDIR /app
COPY --from=build --chown=taskhub:taskhub /app /app
ENV PATH="/app/.venv/bin:$PATH" PYTHONUNBUFFERED=1 DJANGO_SETTINGS_MODULE=taskhub.settings
USER taskhub
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"
CMD ["daphne", "--bind", "0.0.0.0", "--port", "8000", "--proxy-headers", "taskhub.asgi:application"]
