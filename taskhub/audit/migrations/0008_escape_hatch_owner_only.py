from django.db import migrations

# The escape hatch for TRUNCATE (0006: `taskhub.allow_audit_truncate`, which only the test suite sets) is a setting any
# session can set; from here it counts only for a member of the table owner's role (taskhub/database/roles.py: in
# production the application runs as another role, which also lacks the TRUNCATE privilege).
ALLOW_SETTING = "taskhub.allow_audit_truncate"


def refuse_truncate(*, owner_only: bool) -> str:
    allowed = f"current_setting('{ALLOW_SETTING}', true) IS NOT DISTINCT FROM 'on'"
    if owner_only:
        allowed += " AND pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = TG_RELID), 'USAGE')"
    return f"""
CREATE OR REPLACE FUNCTION audit_auditevent_refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT ({allowed}) THEN
        RAISE EXCEPTION 'audit_auditevent is append-only: TRUNCATE refused'
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'Audit events can be added, never changed or deleted.';
    END IF;
    RETURN NULL;
END
$$;
"""


class Migration(migrations.Migration):
    dependencies = (("audit", "0007_agent_indexes"),)

    operations = (
        migrations.RunSQL(sql=refuse_truncate(owner_only=True), reverse_sql=refuse_truncate(owner_only=False)),
    )
