"""Users with roles, for any test that needs one: `make_user("olga", OPERATORS)`."""

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

TEST_PASSWORD = "a long test passphrase"


def make_user(username: str, *group_names: str, password: str | None = None, **fields):
    """Without a password the account cannot sign in by form (use force_login): hashing one takes ~0.3 s."""
    user = get_user_model().objects.create_user(username=username, password=password, **fields)
    for name in group_names:
        user.groups.add(Group.objects.get_or_create(name=name)[0])
    return user
