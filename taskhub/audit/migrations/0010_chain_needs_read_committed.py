"""The chain trigger (0009) reads the month's last row after taking the month's lock: under READ COMMITTED that read
sees what the previous holder committed. Under REPEATABLE READ or SERIALIZABLE it would read the transaction's older
snapshot and fork the chain, so there it refuses, as a serialization failure (a retry in a fresh transaction works).
taskhub itself runs every transaction under READ COMMITTED."""

from django.db import migrations

LOCK_CLASS = 36036  # as in 0009
GENESIS = "'\\x" + "00" * 32 + "'::bytea"
GUARD = """
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'audit rows are chained under READ COMMITTED only, not %%',
            current_setting('transaction_isolation') USING ERRCODE = 'serialization_failure';
    END IF;"""


def chain_function(*, guard: str) -> str:
    return f"""
CREATE OR REPLACE FUNCTION audit_auditevent_chain() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    month_start timestamptz := date_trunc('month', NEW.time, 'UTC');
    last_id bigint;
    last_hash bytea;
BEGIN{guard}
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
"""


class Migration(migrations.Migration):
    dependencies = (("audit", "0009_monthly_partitions_hash_chain"),)

    operations = (
        migrations.RunSQL(sql=chain_function(guard=GUARD.replace("%%", "%")), reverse_sql=chain_function(guard="")),
    )
