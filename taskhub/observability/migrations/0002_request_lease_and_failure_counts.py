from django.db import migrations, models

# As in 0001: INSERT and DELETE once per statement, grouped; UPDATE per row, only when a counted column changes.
REQUEST_TRIGGERS = """
CREATE FUNCTION observability_input_requests_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_inputrequeststatedelta (server_id, state, delta)
    SELECT server_id, state, count(*) FROM inserted_requests WHERE state IN ('open', 'answered')
    GROUP BY server_id, state;
    RETURN NULL;
END $$;

CREATE FUNCTION observability_input_requests_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_inputrequeststatedelta (server_id, state, delta)
    SELECT server_id, state, -count(*) FROM deleted_requests WHERE state IN ('open', 'answered')
    GROUP BY server_id, state;
    RETURN NULL;
END $$;

CREATE FUNCTION observability_input_request_state_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_inputrequeststatedelta (server_id, state, delta)
    SELECT server_id, state, delta FROM (VALUES (OLD.server_id, OLD.state, -1), (NEW.server_id, NEW.state, 1))
        AS change (server_id, state, delta)
    WHERE state IN ('open', 'answered');
    RETURN NULL;
END $$;

CREATE TRIGGER observability_input_requests_inserted AFTER INSERT ON tasks_inputrequest
    REFERENCING NEW TABLE AS inserted_requests FOR EACH STATEMENT
    EXECUTE FUNCTION observability_input_requests_inserted();
CREATE TRIGGER observability_input_requests_deleted AFTER DELETE ON tasks_inputrequest
    REFERENCING OLD TABLE AS deleted_requests FOR EACH STATEMENT
    EXECUTE FUNCTION observability_input_requests_deleted();
CREATE TRIGGER observability_input_request_state_changed AFTER UPDATE OF state, server_id ON tasks_inputrequest
    FOR EACH ROW WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.server_id IS DISTINCT FROM NEW.server_id)
    EXECUTE FUNCTION observability_input_request_state_changed();

INSERT INTO observability_inputrequeststatedelta (server_id, state, delta)
SELECT server_id, state, count(*) FROM tasks_inputrequest WHERE state IN ('open', 'answered') GROUP BY 1, 2;
"""

# Poll rows by lease owner, and by server and failures in a row (a server's most is the highest count with rows;
# a row counts there from its first failure until it answers or ends). The tracker's hot statements do not call
# these functions: a reschedule sets consecutive_failures but the WHEN stops it unless the failures changed (a
# failing poll, a recovery), a renewal sets neither column, and a claim that keeps the owner is stopped by the WHEN.
# The server of a failing row is its task's: a task never changes server, and its poll row is deleted before it.
POLL_TRIGGERS = """
CREATE FUNCTION observability_polls_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_leaseownerdelta (owner, delta)
    SELECT lease_owner, count(*) FROM inserted_polls WHERE lease_owner <> '' GROUP BY lease_owner;
    INSERT INTO observability_pollfailuredelta (server_id, failures, delta)
    SELECT task.server_id, poll.consecutive_failures, count(*)
    FROM inserted_polls AS poll JOIN tasks_task AS task ON task.id = poll.task_id
    WHERE poll.consecutive_failures > 0 GROUP BY 1, 2;
    RETURN NULL;
END $$;

CREATE FUNCTION observability_polls_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_leaseownerdelta (owner, delta)
    SELECT lease_owner, -count(*) FROM deleted_polls WHERE lease_owner <> '' GROUP BY lease_owner;
    INSERT INTO observability_pollfailuredelta (server_id, failures, delta)
    SELECT task.server_id, poll.consecutive_failures, -count(*)
    FROM deleted_polls AS poll JOIN tasks_task AS task ON task.id = poll.task_id
    WHERE poll.consecutive_failures > 0 GROUP BY 1, 2;
    RETURN NULL;
END $$;

CREATE FUNCTION observability_poll_owner_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_leaseownerdelta (owner, delta)
    SELECT owner, delta FROM (VALUES (OLD.lease_owner, -1), (NEW.lease_owner, 1)) AS change (owner, delta)
    WHERE owner <> '';
    RETURN NULL;
END $$;

CREATE FUNCTION observability_poll_failures_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO observability_pollfailuredelta (server_id, failures, delta)
    SELECT task.server_id, change.failures, change.delta
    FROM (VALUES (OLD.consecutive_failures, -1), (NEW.consecutive_failures, 1)) AS change (failures, delta)
    JOIN tasks_task AS task ON task.id = NEW.task_id
    WHERE change.failures > 0;
    RETURN NULL;
END $$;

CREATE TRIGGER observability_polls_inserted AFTER INSERT ON tasks_taskpoll
    REFERENCING NEW TABLE AS inserted_polls FOR EACH STATEMENT EXECUTE FUNCTION observability_polls_inserted();
CREATE TRIGGER observability_polls_deleted AFTER DELETE ON tasks_taskpoll
    REFERENCING OLD TABLE AS deleted_polls FOR EACH STATEMENT EXECUTE FUNCTION observability_polls_deleted();
CREATE TRIGGER observability_poll_owner_changed AFTER UPDATE OF lease_owner ON tasks_taskpoll
    FOR EACH ROW WHEN (OLD.lease_owner IS DISTINCT FROM NEW.lease_owner)
    EXECUTE FUNCTION observability_poll_owner_changed();
CREATE TRIGGER observability_poll_failures_changed AFTER UPDATE OF consecutive_failures ON tasks_taskpoll
    FOR EACH ROW WHEN (OLD.consecutive_failures IS DISTINCT FROM NEW.consecutive_failures)
    EXECUTE FUNCTION observability_poll_failures_changed();

INSERT INTO observability_leaseownerdelta (owner, delta)
SELECT lease_owner, count(*) FROM tasks_taskpoll WHERE lease_owner <> '' GROUP BY 1;
INSERT INTO observability_pollfailuredelta (server_id, failures, delta)
SELECT task.server_id, poll.consecutive_failures, count(*)
FROM tasks_taskpoll AS poll JOIN tasks_task AS task ON task.id = poll.task_id
WHERE poll.consecutive_failures > 0 GROUP BY 1, 2;
"""

DROP_TRIGGERS = """
DROP TRIGGER observability_poll_failures_changed ON tasks_taskpoll;
DROP TRIGGER observability_poll_owner_changed ON tasks_taskpoll;
DROP TRIGGER observability_polls_deleted ON tasks_taskpoll;
DROP TRIGGER observability_polls_inserted ON tasks_taskpoll;
DROP FUNCTION observability_poll_failures_changed();
DROP FUNCTION observability_poll_owner_changed();
DROP FUNCTION observability_polls_deleted();
DROP FUNCTION observability_polls_inserted();
DROP TRIGGER observability_input_request_state_changed ON tasks_inputrequest;
DROP TRIGGER observability_input_requests_deleted ON tasks_inputrequest;
DROP TRIGGER observability_input_requests_inserted ON tasks_inputrequest;
DROP FUNCTION observability_input_request_state_changed();
DROP FUNCTION observability_input_requests_deleted();
DROP FUNCTION observability_input_requests_inserted();
"""

# Partial indexes for the reads of /metrics that stay queries (collectors.py), each as small as what it finds:
# - the oldest answer not yet delivered (few rows: answers wait seconds);
# - the due jobs of a kind, oldest first (procrastinate's own indexes order by id or priority, not by kind).
CREATE_INDEXES = """
CREATE INDEX observability_answered_since ON tasks_inputrequest (answered_at) WHERE state = 'answered';
CREATE INDEX observability_jobs_todo_by_kind ON procrastinate_jobs (task_name, scheduled_at, id)
    WHERE status = 'todo';
"""

DROP_INDEXES = """
DROP INDEX observability_jobs_todo_by_kind;
DROP INDEX observability_answered_since;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("observability", "0001_task_status_deltas"),
        ("tasks", "0010_input_request_acceptances"),
        ("procrastinate", "0041_post_retry_failed_job"),
    ]

    operations = [
        migrations.CreateModel(
            name="InputRequestStateDelta",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("server_id", models.BigIntegerField()),
                ("state", models.CharField(max_length=12)),
                ("delta", models.BigIntegerField()),
            ],
            options={"verbose_name": "input request state delta"},
        ),
        migrations.CreateModel(
            name="LeaseOwnerDelta",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("owner", models.CharField(max_length=200)),
                ("delta", models.BigIntegerField()),
            ],
            options={"verbose_name": "lease owner delta"},
        ),
        migrations.CreateModel(
            name="PollFailureDelta",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("server_id", models.BigIntegerField()),
                ("failures", models.PositiveIntegerField()),
                ("delta", models.BigIntegerField()),
            ],
            options={"verbose_name": "poll failure delta"},
        ),
        migrations.RunSQL(REQUEST_TRIGGERS + POLL_TRIGGERS, DROP_TRIGGERS),
        migrations.RunSQL(CREATE_INDEXES, DROP_INDEXES),
    ]
