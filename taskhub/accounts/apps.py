from django.apps import AppConfig
from django.contrib.auth.signals import user_logged_in
from django.db.models.signals import post_migrate


class AccountsConfig(AppConfig):
    name = "taskhub.accounts"
    label = "accounts"
    verbose_name = "taskhub accounts and roles"

    def ready(self) -> None:
        from taskhub.accounts import language, ratelimit
        from taskhub.accounts.groups import ensure_role_groups_after_migrate

        # `flush` (transactional tests, `manage.py flush`) empties auth_group and then sends post_migrate,
        # as Django does to bring back permissions; this brings the role groups back the same way.
        post_migrate.connect(ensure_role_groups_after_migrate, dispatch_uid="taskhub.accounts.role_groups")
        user_logged_in.connect(ratelimit.on_logged_in, dispatch_uid="taskhub.accounts.logged_in")
        user_logged_in.connect(language.on_logged_in, dispatch_uid="taskhub.accounts.language")
