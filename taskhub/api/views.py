"""API tokens on a page: each person creates (name, expiry), sees the secret once, lists and revokes their own;
admins see and revoke everyone's. Every create and revoke is audited by taskhub.api.tokens."""

from django.contrib import messages
from django.db.models import Count
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.translation import gettext

from taskhub.accounts import permissions
from taskhub.accounts.permissions import signed_in_required
from taskhub.api.forms import TokenForm
from taskhub.api.models import ApiToken
from taskhub.api.tokens import create_token, revoke_token

PAGE = "api/tokens.html"


def tokens_visible_to(user):
    tokens = ApiToken.objects.select_related("user").order_by("revoked_at", "-created_at")
    return tokens if permissions.is_admin(user) else tokens.filter(user=user)


CREATED = "api_token_created"  # the session key holding a new token's secret until the page shows it, once


@signed_in_required
def token_list(request):
    """POST creates a token and redirects (POST/redirect/GET: reloading the page creates no second token); the
    secret waits in the session for that one GET, which takes it out, so it is shown once."""
    form = TokenForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        token, secret = create_token(
            user=request.user, name=form.cleaned_data["name"], created_by=request.user, expires_at=form.expires_at()
        )
        request.session[CREATED] = {"token": token.pk, "secret": secret}
        return redirect("tokens:list")
    created = None
    shown = request.session.pop(CREATED, None) if request.method == "GET" else None
    if shown:
        token = ApiToken.objects.filter(pk=shown["token"], user=request.user, revoked_at__isnull=True).first()
        created = {"token": token, "secret": shown["secret"]} if token else None
    context = {
        "form": form,
        "created": created,
        # How many tasks each launched (an index-only count on the partial task_token_created index).
        "tokens": tokens_visible_to(request.user).annotate(launched=Count("launched_tasks")),
        "everyone": permissions.is_admin(request.user),
    }
    response = render(request, PAGE, context, status=400 if form.is_bound and form.errors else 200)
    if created is not None:
        response["Cache-Control"] = "no-store"  # the secret is on this page once, and never in a cache
    return response


@signed_in_required
def token_revoke(request, token_id: int):
    """GET asks for confirmation (what stops working); POST, from that page, revokes."""
    token = tokens_visible_to(request.user).filter(pk=token_id).first()
    if token is None:
        raise Http404("No such token.")
    if token.revoked_at is not None:
        messages.info(
            request,
            gettext("The token “%(name)s” (%(prefix)s…) was revoked already.")
            % {"name": token.name, "prefix": token.prefix},
        )
        return redirect("tokens:list")
    if request.method != "POST":
        return render(request, "api/token_revoke.html", {"token": token, "own": token.user_id == request.user.pk})
    revoke_token(token=token, revoked_by=request.user)
    messages.success(
        request,
        gettext("Revoked the token “%(name)s” (%(prefix)s…): it no longer works.")
        % {"name": token.name, "prefix": token.prefix},
    )
    return redirect("tokens:list")
