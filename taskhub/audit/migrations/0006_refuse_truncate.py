from django.db import migrations

# TRUNCATE fires no row triggers, so 0003's trigger let it empty the audit table; this statement-level trigger
# refuses it. The test suite empties tables with TRUNCATE after each transactional test (Django's flush), and DELETE
# is refused row by row, so a session may opt in with the setting below: only tests/settings.py sets it (as a
# connection option of the test process). It is no weaker than before: whoever can set it can run SQL as the
# application's role, which owns the table and could drop the trigger anyway; it stops the application, its
# commands (`manage.py flush`) and anyone working through them from emptying the trail.
ALLOW_SETTING = "taskhub.allow_audit_truncate"

CREATE_TRIGGER = f"""
CREATE FUNCTION audit_auditevent_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('{ALLOW_SETTING}', true) IS DISTINCT FROM 'on' THEN
        RAISE EXCEPTION 'audit_auditevent is append-only: TRUNCATE refused'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Audit events can be added, never changed or deleted.';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER audit_auditevent_no_truncate
    BEFORE TRUNCATE ON audit_auditevent
    FOR EACH STATEMENT EXECUTE FUNCTION audit_auditevent_refuse_truncate();
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS audit_auditevent_no_truncate ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_auditevent_refuse_truncate();
"""


class Migration(migrations.Migration):
    dependencies = (("audit", "0005_action_from_registry"),)

    operations = (migrations.RunSQL(sql=CREATE_TRIGGER, reverse_sql=DROP_TRIGGER),)
