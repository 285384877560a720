from django.utils.functional import SimpleLazyObject

from taskhub.live.nav import nav_counts as counts_for


def nav_counts(request):
    # The nav shows its counts on first paint; the socket keeps them fresh. Lazy: fragments never ask.
    user = request.user
    if not user.is_authenticated:
        return {}
    return {"nav_counts": SimpleLazyObject(lambda: counts_for(user))}
