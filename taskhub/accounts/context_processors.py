from django.utils.functional import SimpleLazyObject

from taskhub.accounts.permissions import roles_of


def roles(request):
    # Lazy: a page that never asks (or a fragment) costs no query.
    return {"roles": SimpleLazyObject(lambda: roles_of(request.user))}
