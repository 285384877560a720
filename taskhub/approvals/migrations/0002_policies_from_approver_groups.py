from django.db import migrations


def policies_from_approver_groups(apps, schema_editor):
    """Each server's approver groups become its policy (every tool; one acceptance). Self-approval stays allowed
    there, as it was: a new policy forbids it by default, a migrated one keeps what people had."""
    server_model = apps.get_model("servers", "Server")
    policy_model = apps.get_model("approvals", "ApprovalPolicy")
    for server in server_model.objects.prefetch_related("approver_groups"):
        groups = list(server.approver_groups.all())
        if groups:
            policy = policy_model.objects.create(server=server, tool="", allow_self_approval=True)
            policy.groups.set(groups)


def approver_groups_from_policies(apps, schema_editor):
    policy_model = apps.get_model("approvals", "ApprovalPolicy")
    for policy in policy_model.objects.filter(tool="").select_related("server").prefetch_related("groups"):
        policy.server.approver_groups.add(*policy.groups.all())


class Migration(migrations.Migration):
    dependencies = [("approvals", "0001_initial"), ("servers", "0005_server_removed")]

    operations = [migrations.RunPython(policies_from_approver_groups, approver_groups_from_policies)]
