"""The role groups. A user's roles are their memberships; permissions.py decides what they allow."""

APPROVERS = "approvers"
OPERATORS = "operators"
ADMINS = "admins"
AGENTS = "agents"  # accounts that launch tools through API tokens (the JSON API, the MCP gateway), not the pages
ROLE_GROUPS = (APPROVERS, OPERATORS, ADMINS, AGENTS)


def ensure_role_groups_after_migrate(sender, using, apps=None, **kwargs) -> None:
    # Django sends post_migrate only to apps with a models module, which accounts has not: listen for auth's.
    # `migrate` passes the migration state's apps; `flush` passes none, and then the live registry is right.
    if sender.label != "auth":
        return
    if apps is None:
        from django.apps import apps
    try:
        group_model = apps.get_model("auth", "Group")
    except LookupError:  # auth not migrated in this plan
        return
    group_model.objects.using(using).bulk_create(
        [group_model(name=name) for name in ROLE_GROUPS], ignore_conflicts=True
    )
