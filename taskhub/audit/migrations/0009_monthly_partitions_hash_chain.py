"""Issue 36: the audit table becomes partitioned by month (retention drops a month whole) and each row carries a hash
over its content and the previous row's hash.

One chain per month (the month of `time`, UTC), so that archiving and dropping a month leaves every other month's
chain whole, and a late row (a clock a little behind) extends its own month without forking the next one. The hash is
computed by a BEFORE INSERT trigger under a transaction-level advisory lock per month: writers of the same month take
their turn from the trigger to their commit, and the trigger (a volatile function, each statement with a fresh
snapshot under READ COMMITTED) sees the row the last writer committed. Under the lock the trigger also gives the row a
new id when its own (taken from the sequence before the lock) is not above the chain's last one, so that within a
month the order of ids is the order of the chain: `audit verify` and the offline script walk a month by id.

The content hashed is `jsonb_build_array(id, time in microseconds since the epoch, actor_id, actor_label, action,
task_id, server_id, data)::text`; scripts/verify_audit_export.py reproduces that text from an export.

The existing rows are copied in id order through the trigger (their ids kept), the old table dropped. Row-level
triggers (append-only, the chain) are cloned onto every partition by Postgres; the TRUNCATE trigger is added to each
partition by audit_ensure_month, the one way partitions are made (SECURITY DEFINER: the application's role may call it
to make next month's, and nothing else; it owns no table).
"""

from django.db import migrations, models

LOCK_CLASS = 36036  # pg_advisory_xact_lock(LOCK_CLASS, yyyymm): taskhub uses no other two-key advisory lock
GENESIS = "'\\x" + "00" * 32 + "'::bytea"

CREATE = f"""
ALTER TABLE audit_auditevent RENAME TO audit_auditevent_unpartitioned;
ALTER SEQUENCE audit_auditevent_id_seq RENAME TO audit_auditevent_unpartitioned_id_seq;
DROP TRIGGER audit_auditevent_append_only ON audit_auditevent_unpartitioned;
DROP TRIGGER audit_auditevent_no_truncate ON audit_auditevent_unpartitioned;
ALTER INDEX audit_task_time RENAME TO audit_unpartitioned_task_time;
ALTER INDEX audit_server_time RENAME TO audit_unpartitioned_server_time;
ALTER INDEX audit_time RENAME TO audit_unpartitioned_time;
ALTER INDEX audit_agent_time RENAME TO audit_unpartitioned_agent_time;
ALTER INDEX audit_any_agent_time RENAME TO audit_unpartitioned_any_agent_time;

CREATE SEQUENCE audit_auditevent_id_seq;
CREATE TABLE audit_auditevent (
    id bigint NOT NULL DEFAULT nextval('audit_auditevent_id_seq'),
    time timestamp with time zone NOT NULL,
    actor_label varchar(150) NOT NULL,
    action varchar(64) NOT NULL,
    data jsonb NOT NULL,
    actor_id integer NULL,
    server_id bigint NULL,
    task_id uuid NULL,
    prev_hash bytea NULL,
    hash bytea NULL,
    PRIMARY KEY (id, time)
) PARTITION BY RANGE (time);
ALTER SEQUENCE audit_auditevent_id_seq OWNED BY audit_auditevent.id;
CREATE TABLE audit_auditevent_default PARTITION OF audit_auditevent DEFAULT;

CREATE FUNCTION audit_ensure_month(month date) RETURNS text
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    first date := date_trunc('month', month)::date;
    name text := 'audit_auditevent_' || to_char(first, 'YYYY_MM');
BEGIN
    IF to_regclass(name) IS NULL THEN
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF audit_auditevent FOR VALUES FROM (%L) TO (%L)',
            name, first::text || ' 00:00:00+00', (first + interval '1 month')::date::text || ' 00:00:00+00'
        );
        EXECUTE format(
            'CREATE TRIGGER audit_auditevent_no_truncate BEFORE TRUNCATE ON %I'
            ' FOR EACH STATEMENT EXECUTE FUNCTION audit_auditevent_refuse_truncate()',
            name
        );
    END IF;
    RETURN name;
END
$$;
REVOKE ALL ON FUNCTION audit_ensure_month(date) FROM PUBLIC;

CREATE FUNCTION audit_row_hash(
    prev bytea, row_id bigint, at timestamptz, actor integer, label text, verb text, task uuid, server bigint,
    body jsonb
) RETURNS bytea LANGUAGE sql STABLE AS $$
    SELECT sha256(prev || convert_to(jsonb_build_array(
        row_id, (extract(epoch FROM at) * 1000000)::bigint, actor, label, verb, task, server, body
    )::text, 'UTF8'))
$$;

CREATE FUNCTION audit_auditevent_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    month_start timestamptz := date_trunc('month', NEW.time, 'UTC');
    last_id bigint;
    last_hash bytea;
BEGIN
    PERFORM pg_advisory_xact_lock({LOCK_CLASS}, to_char(month_start AT TIME ZONE 'UTC', 'YYYYMM')::integer);
    SELECT id, hash INTO last_id, last_hash FROM audit_auditevent
        WHERE time >= month_start AND time < month_start + interval '1 month' ORDER BY id DESC LIMIT 1;
    IF last_id IS NOT NULL AND NEW.id <= last_id THEN
        NEW.id := nextval('audit_auditevent_id_seq');
    END IF;
    NEW.prev_hash := coalesce(last_hash, {GENESIS});
    NEW.hash := audit_row_hash(NEW.prev_hash, NEW.id, NEW.time, NEW.actor_id, NEW.actor_label, NEW.action,
                               NEW.task_id, NEW.server_id, NEW.data);
    RETURN NEW;
END
$$;
CREATE TRIGGER audit_auditevent_chain BEFORE INSERT ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_auditevent_chain();
CREATE TRIGGER audit_auditevent_append_only BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_auditevent_refuse_change();
CREATE TRIGGER audit_auditevent_no_truncate BEFORE TRUNCATE ON audit_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION audit_auditevent_refuse_truncate();
CREATE TRIGGER audit_auditevent_no_truncate BEFORE TRUNCATE ON audit_auditevent_default
    FOR EACH STATEMENT EXECUTE FUNCTION audit_auditevent_refuse_truncate();

SELECT audit_ensure_month(month::date) FROM generate_series(
    date_trunc('month', coalesce((SELECT min(time) FROM audit_auditevent_unpartitioned), now()), 'UTC'),
    date_trunc('month', now(), 'UTC') + interval '2 months',
    interval '1 month'
) AS month;

INSERT INTO audit_auditevent (id, time, actor_label, action, data, actor_id, server_id, task_id)
    SELECT id, time, actor_label, action, data, actor_id, server_id, task_id
    FROM audit_auditevent_unpartitioned ORDER BY id;
SELECT setval('audit_auditevent_id_seq', greatest(
    (SELECT max(id) FROM audit_auditevent), (SELECT last_value FROM audit_auditevent_unpartitioned_id_seq), 1
));
DROP TABLE audit_auditevent_unpartitioned;
ALTER TABLE audit_auditevent RENAME CONSTRAINT audit_auditevent_pkey1 TO audit_auditevent_pkey;

CREATE INDEX audit_task_time ON audit_auditevent (task_id, time);
CREATE INDEX audit_server_time ON audit_auditevent (server_id, time);
CREATE INDEX audit_time ON audit_auditevent (time);
CREATE INDEX audit_agent_time ON audit_auditevent (((data #>> '{{agent,token_id}}')), time DESC) WHERE data ? 'agent';
CREATE INDEX audit_any_agent_time ON audit_auditevent (time DESC) WHERE data ? 'agent';
CREATE INDEX audit_people_time ON audit_auditevent (time DESC) WHERE actor_id IS NOT NULL;
"""


class Migration(migrations.Migration):
    atomic = True
    dependencies = (("audit", "0008_escape_hatch_owner_only"),)

    operations = (
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(sql=CREATE)],
            state_operations=[
                migrations.AddField(
                    model_name="auditevent",
                    name="prev_hash",
                    field=models.BinaryField(editable=False, null=True),
                ),
                migrations.AddField(
                    model_name="auditevent",
                    name="hash",
                    field=models.BinaryField(editable=False, null=True),
                ),
                migrations.AddIndex(
                    model_name="auditevent",
                    index=models.Index(
                        models.OrderBy(models.F("time"), descending=True),
                        condition=models.Q(("actor__isnull", False)),
                        name="audit_people_time",
                    ),
                ),
            ],
        ),
    )
