"""Audit rows are chained after their transaction commits (sealed), no longer inside it.

Until now (0009) a BEFORE INSERT trigger chained each row under the month's advisory lock, held from a transaction's
first audit row until its commit. Any lock that transaction took afterwards could close a cycle with one that held
that lock's row and waited for the month: a launch retry writes its audit row, then locks its server to count the
failure, while a failure recorded for the same server locks the server, then writes its audit row. Postgres broke
such cycles by failing one transaction (seen in CI). Writers also took turns from their first audit row to commit.

Now a row is inserted unsealed (prev_hash, hash and seq NULL, whatever the writer sent) and takes no lock.
`audit_seal(batch)` (SECURITY DEFINER, so the application's role, which may not UPDATE the table, can run it) seals
committed rows in id order under one advisory lock held only by sealers: each gets `seq`, the next number of
audit_auditevent_seq_seq (so within a month the order of seq is the order of the chain), the hash of the month's last
sealed row as prev_hash, and its hash over the same content as before. The worker seals every minute; `audit verify`,
the verify page, exports and archives seal first. The append-only trigger lets exactly that UPDATE through (an
unsealed row's three chain columns, nothing else, inside audit_seal); every other UPDATE and DELETE is refused as
before. A sealer's transaction takes no other lock, so it can be in no cycle.

The rows sealed before this migration keep their hashes; their seq is their id (0009 made id order their chain
order), and the sequence starts above every id. Sealing reads the month's last sealed row, so it runs under READ
COMMITTED only (0010's guard moves here).
"""

from importlib import import_module

from django.db import migrations, models

LOCK_CLASS = 36036  # as in 0009: pg_advisory_xact_lock(LOCK_CLASS, 0) is the sealers' (0009's were yyyymm per month)
GENESIS = "'\\x" + "00" * 32 + "'::bytea"
SEALING = "taskhub.audit_sealing"

FORWARD = f"""
ALTER TABLE audit_auditevent ADD COLUMN seq bigint NULL;
CREATE SEQUENCE audit_auditevent_seq_seq;
ALTER TABLE audit_auditevent DISABLE TRIGGER audit_auditevent_append_only;
UPDATE audit_auditevent SET seq = id;
ALTER TABLE audit_auditevent ENABLE TRIGGER audit_auditevent_append_only;
SELECT setval('audit_auditevent_seq_seq', greatest((SELECT max(id) FROM audit_auditevent), 1));
CREATE INDEX audit_seq ON audit_auditevent (seq);
CREATE INDEX audit_unsealed ON audit_auditevent (id) WHERE hash IS NULL;

CREATE OR REPLACE FUNCTION audit_auditevent_chain() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.prev_hash := NULL;
    NEW.hash := NULL;
    NEW.seq := NULL;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION audit_auditevent_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND current_setting('{SEALING}', true) IS NOT DISTINCT FROM 'on'
        AND OLD.hash IS NULL AND OLD.seq IS NULL
        AND (NEW.id, NEW.time, NEW.actor_id, NEW.actor_label, NEW.action, NEW.task_id, NEW.server_id, NEW.data)
            IS NOT DISTINCT FROM
            (OLD.id, OLD.time, OLD.actor_id, OLD.actor_label, OLD.action, OLD.task_id, OLD.server_id, OLD.data)
        AND NEW.hash = audit_row_hash(NEW.prev_hash, NEW.id, NEW.time, NEW.actor_id, NEW.actor_label, NEW.action,
                                      NEW.task_id, NEW.server_id, NEW.data) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'audit_auditevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Audit events can be added, never changed or deleted.';
END
$$;

CREATE FUNCTION audit_seal(batch integer) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    unsealed record;
    month_start timestamptz;
    head_month timestamptz;
    head bytea;
    sealed integer := 0;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'audit rows are sealed under READ COMMITTED only, not %',
            current_setting('transaction_isolation') USING ERRCODE = 'serialization_failure';
    END IF;
    PERFORM pg_advisory_xact_lock({LOCK_CLASS}, 0);
    PERFORM set_config('{SEALING}', 'on', true);
    -- Read after the lock: a sealer before this one has committed, and this statement's snapshot sees its rows.
    FOR unsealed IN SELECT id, time FROM audit_auditevent WHERE hash IS NULL ORDER BY id LIMIT batch LOOP
        month_start := date_trunc('month', unsealed.time, 'UTC');
        IF head_month IS DISTINCT FROM month_start THEN
            SELECT hash INTO head FROM audit_auditevent
                WHERE time >= month_start AND time < month_start + interval '1 month' AND seq IS NOT NULL
                ORDER BY seq DESC LIMIT 1;
            head := coalesce(head, {GENESIS});
            head_month := month_start;
        END IF;
        UPDATE audit_auditevent SET
            seq = nextval('audit_auditevent_seq_seq'),
            prev_hash = head,
            hash = audit_row_hash(head, id, time, actor_id, actor_label, action, task_id, server_id, data)
        WHERE id = unsealed.id AND time = unsealed.time
        RETURNING hash INTO head;
        sealed := sealed + 1;
    END LOOP;
    PERFORM set_config('{SEALING}', 'off', true);
    RETURN sealed;
END
$$;
"""

# Back to 0010: everything sealed first (the old trigger chains from the last row by id), its trigger function
# restored, seq dropped.
_0010 = import_module("taskhub.audit.migrations.0010_chain_needs_read_committed")
PREVIOUS_CHAIN = _0010.chain_function(guard=_0010.GUARD.replace("%%", "%"))
BACKWARD = f"""
DO $$ BEGIN
    WHILE audit_seal(10000) > 0 LOOP END LOOP;
END $$;
DROP FUNCTION audit_seal(integer);
CREATE OR REPLACE FUNCTION audit_auditevent_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Audit events can be added, never changed or deleted.';
END
$$;
{PREVIOUS_CHAIN}DROP INDEX audit_unsealed;
DROP INDEX audit_seq;
ALTER TABLE audit_auditevent DROP COLUMN seq;
DROP SEQUENCE audit_auditevent_seq_seq;
"""


class Migration(migrations.Migration):
    dependencies = (("audit", "0010_chain_needs_read_committed"),)

    operations = (
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)],
            state_operations=[
                migrations.AddField(
                    model_name="auditevent",
                    name="seq",
                    field=models.BigIntegerField(editable=False, null=True),
                ),
            ],
        ),
    )
