"""procrastinate's worker middleware that counts every job run by kind (launch, answer_delivery, cancel, discovery,
webhook, mail_digest, sweep) and outcome: succeeded, retried (it raised and will run again, a busy server's turn
included) or failed (it raised and will not)."""

from __future__ import annotations

import time

from taskhub.observability import metrics
from taskhub.servers import hooks as server_hooks
from taskhub.tasks import hooks as task_hooks

KINDS = {
    task_hooks.LAUNCH_JOB: "launch",
    task_hooks.ANSWER_DELIVERY_JOB: "answer_delivery",
    task_hooks.CANCEL_DELIVERY_JOB: "cancel",
    server_hooks.DISCOVERY_JOB: "discovery",
    # taskhub.approvals.hooks.WEBHOOK_DELIVERY_JOB and approvals.notifications.outbox.MAIL_DIGEST_JOB, spelt out: this
    # layer does not import approvals (pyproject's import contract); tests/test_approval_webhooks.py and
    # tests/test_notifications.py check that the names agree.
    "taskhub.deliver_webhook": "webhook",
    "taskhub.send_mail_digest": "mail_digest",
}
OTHER_KIND = "sweep"  # the periodic sweeps (worker/sweeps.py)


def job_kind(task_name: str) -> str:
    return KINDS.get(task_name, OTHER_KIND)


def worker_middleware() -> list:
    """What `app.run_worker_async(worker_middleware=...)` takes; marks this process as a worker."""
    metrics.process_started("worker")
    return [count_job]


async def count_job(call_next, context, worker):
    kind = job_kind(context.job.task_name)
    started = time.monotonic()
    try:
        result = await call_next()
    except BaseException as error:
        metrics.job_ran(kind, _outcome(context, error), time.monotonic() - started)
        raise
    metrics.job_ran(kind, "succeeded", time.monotonic() - started)
    return result


def _outcome(context, error: BaseException) -> str:
    try:
        retried = context.task.get_retry_exception(error, context.job) is not None
    except Exception:
        return "failed"
    return "retried" if retried else "failed"
