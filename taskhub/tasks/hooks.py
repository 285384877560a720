"""Where services hand work to background jobs, inside their transaction. No-ops until the jobs exist (issue 3, part 2).

Part 2 turns each into a procrastinate `defer` on the Django connector, so the job row is committed
with the state and its audit row, or not at all.
"""

import uuid


def enqueue_launch(task_id: uuid.UUID) -> None:
    """The launch job sends tools/call for a task in status `launching` and records its outcome."""


def enqueue_answer_delivery(input_request_id: int) -> None:
    """The delivery job sends the answer (tasks/update, or an MRTR retry) and marks it delivered."""


def enqueue_cancel_delivery(task_id: uuid.UUID) -> None:
    """The cancel job sends tasks/cancel once the remote task id is known, and marks it delivered."""
