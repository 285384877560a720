from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from taskhub.api.tokens import create_token


class Command(BaseCommand):
    help = "Create an API token acting as USER; the token is printed once and cannot be shown again."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="command line", help="what the token is for")

    def handle(self, *args, username, name, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"No active user {username!r}.")
        token, secret = create_token(user=user, name=name)
        self.stderr.write(f"Token {token.prefix}… for {username} ({name}); store it now, it is not shown again:")
        self.stdout.write(secret)
