from django.db import migrations

# TRUNCATE is left alone: Django's test runner and `manage.py flush` empty tables with TRUNCATE, and the
# table owner (who runs migrations) can drop the trigger anyway. The trigger keeps the application and
# anyone working through it from rewriting history; it is not a defence against the owner role.
CREATE_TRIGGER = """
CREATE FUNCTION audit_auditevent_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_auditevent is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'Audit events can be added, never changed or deleted.';
END
$$;
CREATE TRIGGER audit_auditevent_append_only
    BEFORE UPDATE OR DELETE ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION audit_auditevent_refuse_change();
"""

DROP_TRIGGER = """
DROP TRIGGER IF EXISTS audit_auditevent_append_only ON audit_auditevent;
DROP FUNCTION IF EXISTS audit_auditevent_refuse_change();
"""


class Migration(migrations.Migration):
    dependencies = (("audit", "0002_initial"),)

    operations = (migrations.RunSQL(sql=CREATE_TRIGGER, reverse_sql=DROP_TRIGGER),)
