"""manage.py people list|add|groups|deactivate|reactivate|reset-password: the People page from a terminal (the same
services, taskhub/accounts/people.py). A new or reset password is printed once, or read from standard input."""

import sys

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from taskhub.accounts import people


class Command(BaseCommand):
    help = "Add people, set their groups (roles), deactivate or reactivate them, reset their password."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        actions.add_parser("list", help="everyone, with their groups and state")
        adding = actions.add_parser("add", help="add a person (their password is printed once)")
        adding.add_argument("username")
        adding.add_argument("--email", default="")
        adding.add_argument("--group", action="append", default=[], help="a group, e.g. approvers (repeat)")
        adding.add_argument("--password-stdin", action="store_true", help="read the password from standard input")
        grouping = actions.add_parser("groups", help="set a person's groups (exactly those given)")
        grouping.add_argument("username")
        grouping.add_argument("--group", action="append", default=[], help="a group (repeat); none: no group")
        for name, words in (
            ("deactivate", "end their sessions and live pages, revoke their API tokens; they cannot sign in"),
            ("reactivate", "let them sign in again"),
        ):
            actions.add_parser(name, help=words).add_argument("username")
        resetting = actions.add_parser("reset-password", help="a new password (printed once); their sessions end")
        resetting.add_argument("username")
        resetting.add_argument("--password-stdin", action="store_true")

    def handle(self, *args, action, **options):
        try:
            if action == "list":
                return self._list()
            if action == "add":
                user, password = people.add_person(
                    username=options["username"],
                    email=options["email"],
                    groups=people.groups_named(options["group"]),
                    by=None,
                    password=self._password(options),
                )
                self.stdout.write(f"Added {user.get_username()}; password: {password}")
                return
            user = self._person(options["username"])
            if action == "groups":
                people.set_groups(user=user, groups=people.groups_named(options["group"]), by=None)
                self.stdout.write(f"{user.get_username()}: {', '.join(sorted(options['group'])) or 'no group'}")
            elif action == "deactivate":
                ended = people.deactivate_person(user=user, by=None)
                self.stdout.write(
                    f"Deactivated {user.get_username()}: {ended['sessions']} session(s) ended, "
                    f"{ended['tokens']} API token(s) revoked."
                )
            elif action == "reactivate":
                people.reactivate_person(user=user, by=None)
                self.stdout.write(f"Reactivated {user.get_username()}.")
            elif action == "reset-password":
                password = people.reset_password(user=user, by=None, password=self._password(options))
                self.stdout.write(f"New password for {user.get_username()}: {password}")
        except people.PeopleRefused as refused:
            raise CommandError(str(refused)) from refused

    def _person(self, username: str):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"Nobody is called {username!r}: `manage.py people list` shows everyone.")
        return user

    def _password(self, options) -> str | None:
        if not options.get("password_stdin"):
            return None
        password = sys.stdin.readline().rstrip("\n")
        if len(password) < 12:
            raise CommandError("The password from standard input must be at least 12 characters.")
        return password

    def _list(self):
        for user in get_user_model().objects.prefetch_related("groups").order_by("username"):
            groups = ", ".join(sorted(group.name for group in user.groups.all())) or "no group"
            state = "active" if user.is_active else "deactivated"
            self.stdout.write(f"{user.get_username()}\t{state}\t{groups}")
