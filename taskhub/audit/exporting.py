"""One audit row as exports and archives write it (taskhub/audit/views.py, taskhub/audit/retention.py)."""

import datetime
import json

from django.db.models import TextField
from django.db.models.functions import Cast

from taskhub.audit.models import AuditEvent


def export_row(event: AuditEvent) -> dict:
    """One row as exports and archives write it. `data` is the database's own jsonb text (`data_text`, annotated by
    with_data_text): the hash chain covers that text, which a JSON library might re-format."""
    return {
        "id": event.id,
        "time": event.time.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z"),
        "actor_label": event.actor_label,
        "actor_id": event.actor_id,
        "action": event.action,
        "description": event.description,
        "task_id": str(event.task_id) if event.task_id else None,
        "server_id": event.server_id,
        "seq": event.seq,
        "prev_hash": bytes(event.prev_hash).hex() if event.prev_hash is not None else None,
        "hash": bytes(event.hash).hex() if event.hash is not None else None,
        "data": event.data_text,
    }


def export_line(row: dict) -> str:
    """A row as one JSON object, its `data` the jsonb text as stored (valid JSON already), last."""
    data = row.pop("data")
    return json.dumps(row, ensure_ascii=False)[:-1] + f', "data": {data}}}'


def with_data_text(events):
    return events.annotate(data_text=Cast("data", output_field=TextField()))
