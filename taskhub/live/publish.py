"""What services call after commit to tell browsers something changed. A no-op until the live layer exists."""

import uuid


def publish_task_changed(task_id: uuid.UUID) -> None:
    """Tell the pages showing this task (list, timeline, inbox) to re-render it. At-most-once by design."""
