"""`python -m tests.oidc_provider setup REDIRECT_URI CLIENT_ID CLIENT_SECRET USER:PASSWORD:GROUP,GROUP ...` (migrates,
then adds the client and the people); `python -m tests.oidc_provider groups USER [GROUP ...]` (the person's groups now
exactly these; `groups-and-expire`: and their access tokens expired). With DJANGO_SETTINGS_MODULE=
tests.oidc_provider.settings and its OIDC_TEST_* variables."""

import datetime
import sys

import django


def main(argv: list[str]) -> None:
    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from django.utils import timezone
    from oauth2_provider.models import AccessToken, Application

    command, *args = argv
    if command == "setup":
        redirect_uri, client_id, client_secret, *people = args
        call_command("migrate", verbosity=0)
        Application.objects.create(
            name="taskhub",
            client_id=client_id,
            client_secret=client_secret,
            client_type=Application.CLIENT_CONFIDENTIAL,
            authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
            redirect_uris=redirect_uri,
            algorithm=Application.RS256_ALGORITHM,
            skip_authorization=True,
        )
        for person in people:
            username, password, groups = person.split(":")
            user = User.objects.create_user(username=username, password=password, email=f"{username}@example.com")
            user.groups.set([Group.objects.get_or_create(name=name)[0] for name in groups.split(",") if name])
    elif command in ("groups", "groups-and-expire"):
        username, *groups = args
        user = User.objects.get(username=username)
        user.groups.set([Group.objects.get_or_create(name=name)[0] for name in groups])
        if command == "groups-and-expire":  # and the access tokens taskhub holds expired: it must refresh them
            AccessToken.objects.filter(user=user).update(expires=timezone.now() - datetime.timedelta(seconds=1))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
