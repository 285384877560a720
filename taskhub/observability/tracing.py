"""OpenTelemetry traces, off unless configured.

Two traces cross taskhub's processes:
- an approver's answer: `taskhub.answer.submit` (the service that stores it, in the web process) → the job
  `taskhub.job taskhub.deliver_answer` (in a worker; the W3C `traceparent` rides in the job's args), or
  `taskhub.answer.send` where the web process sends the answer itself on its kept client (the context rides on the
  answer handed to the sender's loop) → the SDK's `MCP send tasks/update`, whose context goes to the MCP server in
  the request's `params._meta` (`traceparent`, `tracestate`: SEP-414, done by the `mcp` SDK for every request it
  sends);
- a change seen by a poll: `taskhub.tracker.poll` (worker) → `taskhub.live.publish` (after the snapshot's commit;
  the context rides in the channel-layer message) → `taskhub.live.push` (the socket's consumer, in daphne).

Spans carry ids and names only (task, input request, server, tool, MCP method, job): never arguments, answers,
results or credentials.

Off (nothing configured): no tracer provider is installed, the SDK is never imported, every decorator below calls
straight through after one test of a module global, and jobs and messages carry no trace context.

On: `configure_from_environment()` (called once per process at startup, see `taskhub/web/apps.py`) reads
`TASKHUB_TRACING` — `otlp` (needs the `otlp` extra: `pip install taskhub[otlp]`; the standard `OTEL_EXPORTER_OTLP_*`
variables apply), `console` (spans printed to stderr, to try it out), `off` — and with it unset turns tracing on
when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set. `OTEL_SDK_DISABLED=true` keeps it off,
`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_TRACES_SAMPLER` apply as usual.

The global tracer provider installed then is a switch onto this module's provider, so that the `mcp` SDK's own
spans (and their `_meta` injection) follow taskhub's setting, and so that tests can turn tracing on and off again
in one process (`configure(exporter)` / `shutdown()`): switched off, it hands out no-op tracers as if nothing were
installed.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import NoOpTracer, SpanKind

logger = logging.getLogger(__name__)

# W3C Trace Context keys, in `_meta` (SEP-414), in job args and in channel-layer messages. Baggage is never
# carried: it could hold anything a caller put there.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
CONTEXT_KEYS = (TRACEPARENT, TRACESTATE)
MAX_CONTEXT_CHARS = 512  # a traceparent is 55 characters; tracestate is capped at 512 by W3C

SCOPE = "taskhub"
SERVICE_NAME = "taskhub"
OFF = ("off", "false", "0", "no", "none")
MODES = ("otlp", "console", *OFF)

_NOOP = NoOpTracer()
_provider: Any = None  # an opentelemetry.sdk TracerProvider while tracing is on, else None
_global_installed = False

type Attributes = dict[str, str | int | bool]


class TracingMisconfigured(Exception):
    """TASKHUB_TRACING asks for something this installation cannot do."""


# --- on and off --------------------------------------------------------------------------------------


def enabled() -> bool:
    return _provider is not None


def configure(exporter: Any, *, batch: bool = True, resource_attributes: Mapping[str, str] | None = None) -> None:
    """Turn tracing on in this process, exporting to `exporter` (any opentelemetry SpanExporter).

    `batch=False` exports each span as it ends (tests, the console); a previous configuration is shut down."""
    from opentelemetry.sdk.resources import OTEL_SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    global _provider, _global_installed
    attributes = dict(resource_attributes or {})
    if not os.environ.get(OTEL_SERVICE_NAME):
        attributes.setdefault("service.name", SERVICE_NAME)
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    shutdown()
    _provider = provider
    if not _global_installed:
        # Set once per process (the API refuses a second one): a switch that follows _provider.
        trace.set_tracer_provider(_SwitchProvider())
        _global_installed = True


def shutdown() -> None:
    """Turn tracing off again, flushing what the exporter still holds."""
    global _provider
    provider, _provider = _provider, None
    if provider is not None:
        provider.shutdown()


def configure_from_environment(environ: Mapping[str, str] = os.environ) -> str | None:
    """At startup: turn tracing on if the environment asks for it; the exporter chosen, or None (off)."""
    mode = environ.get("TASKHUB_TRACING", "").strip().lower()
    if mode and mode not in MODES:
        raise TracingMisconfigured(f"TASKHUB_TRACING={mode!r}: use one of {', '.join(MODES[:3])}.")
    if mode in OFF or environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if not mode and (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        mode = "otlp"
    if not mode:
        return None
    if mode == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        configure(ConsoleSpanExporter(out=sys.stderr), batch=False)
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as error:
            raise TracingMisconfigured(
                "Tracing to OTLP needs the OTLP exporter: install taskhub with its `otlp` extra "
                "(pip install 'taskhub[otlp]', or uv sync --extra otlp)."
            ) from error
        configure(OTLPSpanExporter())
    logger.info("tracing on: spans go to the %s exporter", mode)
    return mode


class _SwitchTracer(trace.Tracer):
    """A tracer of this module's provider while tracing is on, a no-op one while it is off."""

    def __init__(self, *scope: Any) -> None:
        self._scope = scope
        self._cached: tuple[Any, trace.Tracer] = (None, _NOOP)

    def _tracer(self) -> trace.Tracer:
        provider = _provider
        if provider is None:
            return _NOOP
        if self._cached[0] is not provider:
            self._cached = (provider, provider.get_tracer(*self._scope))
        return self._cached[1]

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._tracer().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._tracer().start_as_current_span(*args, **kwargs)


class _SwitchProvider(trace.TracerProvider):
    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Any = None,
    ) -> trace.Tracer:
        return _SwitchTracer(instrumenting_module_name, instrumenting_library_version, schema_url, attributes)


_tracer = _SwitchTracer(SCOPE)


# --- carrying a trace across processes ----------------------------------------------------------------


def carrier() -> dict[str, str]:
    """The current span's W3C trace context (`traceparent`, maybe `tracestate`), to put into a job's args or a
    message; empty while tracing is off or no span is current."""
    if _provider is None or not trace.get_current_span().get_span_context().is_valid:
        return {}
    out: dict[str, str] = {}
    propagate.inject(out)
    return {key: out[key] for key in CONTEXT_KEYS if key in out}


def _parent(source: Mapping[str, Any] | None) -> Any:
    """The context to start a span under, from a carrier that may come from anywhere (a job row, a message)."""
    if not isinstance(source, Mapping):
        return None
    values = {key: source[key] for key in CONTEXT_KEYS if isinstance(source.get(key), str)}
    if not values or any(len(value) > MAX_CONTEXT_CHARS for value in values.values()):
        return None
    context = propagate.extract(values)
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def bind[**P, R](function: Callable[P, R]) -> Callable[P, R]:
    """`function` to run in the current context on another thread (an executor or a Thread do not carry it)."""
    if _provider is None:
        return function
    return functools.partial(contextvars.copy_context().run, function)  # type: ignore[return-value]


# --- spans --------------------------------------------------------------------------------------------


def _call_safely(describe: Callable[..., Attributes] | None, *args: Any, **kwargs: Any) -> Attributes:
    """Attributes from a describing function; a failure there costs the span its attributes, never the call."""
    if describe is None:
        return {}
    try:
        return {key: value for key, value in describe(*args, **kwargs).items() if value is not None}
    except Exception:
        logger.warning("tracing: describing a span failed", exc_info=True)
        return {}


def traced(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Callable[..., Attributes] | None = None,
    result_attributes: Callable[[Any], Attributes] | None = None,
    parent: Callable[..., Mapping[str, Any] | None] | None = None,
    new_trace: bool = False,
) -> Callable:
    """Decorate a function (sync or async) to run in a span named `name` while tracing is on.

    `attributes(*args, **kwargs)` describes the call, `result_attributes(result)` adds what the call found out,
    `parent(*args, **kwargs)` gives a W3C carrier (a message) whose trace the span continues; `new_trace` starts
    a trace of its own whatever span is current (a loop that outlives the span it was started in)."""

    def start(args: tuple, kwargs: dict) -> Any:
        context = _parent(_call_safely_mapping(parent, *args, **kwargs)) if parent is not None else None
        if context is None and new_trace:
            context = Context()
        described = _call_safely(attributes, *args, **kwargs)
        return _tracer.start_as_current_span(name, context=context, kind=kind, attributes=described)

    def finish(span: trace.Span, result: Any) -> None:
        if result_attributes is not None and span.is_recording():
            span.set_attributes(_call_safely(result_attributes, result))

    def decorate(function: Callable) -> Callable:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                if _provider is None:
                    return await function(*args, **kwargs)
                with start(args, kwargs) as span:
                    result = await function(*args, **kwargs)
                    finish(span, result)
                    return result

            return async_wrapper

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _provider is None:
                return function(*args, **kwargs)
            with start(args, kwargs) as span:
                result = function(*args, **kwargs)
                finish(span, result)
                return result

        return wrapper

    return decorate


def _call_safely_mapping(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Mapping[str, Any] | None:
    try:
        return function(*args, **kwargs)
    except Exception:
        logger.warning("tracing: reading a trace context failed", exc_info=True)
        return None


# Job arguments that name something, as span attributes (every other argument stays out of the span).
JOB_ID_ARGUMENTS = {"task_id": "taskhub.task.id", "input_request_id": "taskhub.input_request.id"}


def job(function: Callable) -> Callable:
    """Decorate a procrastinate job (`pass_context=True`, under `@app.task`): it runs in a span `taskhub.job <name>`
    continuing the trace whose context its deferral put into its args (`job_args()`). The context arguments are
    taken out whether tracing is on here or not, so a web process tracing and a worker not tracing still agree."""

    @functools.wraps(function)
    async def wrapper(context: Any, *args: Any, **kwargs: Any) -> Any:
        carried = {key: kwargs.pop(key) for key in CONTEXT_KEYS if key in kwargs}
        if _provider is None:
            return await function(context, *args, **kwargs)
        job_row = getattr(context, "job", None)
        task_name = getattr(job_row, "task_name", None) or function.__name__
        described: Attributes = {"taskhub.job.name": task_name}
        if (job_id := getattr(job_row, "id", None)) is not None:
            described["taskhub.job.id"] = job_id
        if isinstance(attempts := getattr(job_row, "attempts", None), int):
            described["taskhub.job.attempts"] = attempts
        for argument, attribute in JOB_ID_ARGUMENTS.items():
            if argument in kwargs:
                described[attribute] = str(kwargs[argument])
        parent = _parent(carried) or Context()  # without a carried context, a trace of its own
        with _tracer.start_as_current_span(
            f"taskhub.job {task_name}", context=parent, kind=SpanKind.CONSUMER, attributes=described
        ):
            return await function(context, *args, **kwargs)

    return wrapper


def job_args() -> dict[str, str]:
    """The trace context to defer a job with (`**tracing.job_args()`), read back by `@tracing.job`."""
    return carrier()


def task_attributes(task: Any) -> Attributes:
    """A task's ids and names for a span: task id, server (its name only if already loaded, no query), tool."""
    attributes: Attributes = {"taskhub.task.id": str(task.pk), "taskhub.server.id": task.server_id}
    server = task._state.fields_cache.get("server")
    if server is not None:
        attributes["taskhub.server.name"] = server.name
    if tool := getattr(task, "tool", None):
        attributes["gen_ai.tool.name"] = str(tool)[:200]
    if remote := getattr(task, "remote_task_id", None):
        attributes["mcp.task.id"] = str(remote)[:200]
    return attributes


def answer_attributes(*_: Any, input_request: Any, **__: Any) -> Attributes:
    """What `services.answer_input` is asked, or the web process sends: which input request of which task (never the
    answer)."""
    return {"taskhub.task.id": str(input_request.task_id), "taskhub.input_request.id": input_request.pk}


def answer_context(*_: Any, input_request: Any, **__: Any) -> Mapping[str, Any] | None:
    """The submit's trace context, kept on an answer the web process sends itself (services.answer_input)."""
    return getattr(input_request, "trace_context", None)


def answered(input_request: Any) -> Attributes:
    """What `services.answer_input` found: the task's server and tool, already loaded."""
    return task_attributes(input_request.task)


def poll_attributes(tracker: Any, claimed: Any) -> Attributes:
    """A tracker's poll (`Tracker._poll(claimed)`): which task on which server, by which method."""
    return {
        "taskhub.task.id": str(claimed.task_id),
        "taskhub.server.id": claimed.server_id,
        "mcp.task.id": str(claimed.remote_task_id)[:200],
        "mcp.method.name": "tasks/get",
        "taskhub.worker.id": str(getattr(tracker, "worker_id", ""))[:200],
    }


def notification_attributes(subscriptions: Any, watch: Any, snapshot: Any) -> Attributes:
    """A task's snapshot notified on a subscription (`Subscriptions._notified`); its task id comes from the
    server, so it is capped."""
    task_id = watch.wanted.get(snapshot.task_id)
    return {
        "taskhub.task.id": str(task_id) if task_id is not None else None,
        "mcp.task.id": str(snapshot.task_id)[:200],
        "mcp.method.name": "notifications/tasks",
    }


def publish_attributes(task_id: Any, server_id: Any = None, asks: Any = False) -> Attributes:
    """A live publish of one changed task (its server given where the caller knew it)."""
    return {"taskhub.task.id": str(task_id), "messaging.system": "channels"}


def push_attributes(consumer: Any, event: Mapping[str, Any]) -> Attributes:
    """One socket's push of a published change (its task id came from our own publish, capped all the same)."""
    return {"taskhub.task.id": str(event.get("task_id"))[:64], "messaging.system": "channels"}


def event_context(consumer: Any, event: Mapping[str, Any]) -> Mapping[str, Any]:
    """The trace context a published message carries (`carrier()` at publish)."""
    return event


def annotate_task(task: Any) -> None:
    """Add a task's ids and names (`task_attributes`) to the current span."""
    if _provider is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(_call_safely(task_attributes, task))
