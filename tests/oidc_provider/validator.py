from django.contrib.auth.models import Group
from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    """preferred_username, email and the person's groups (read when asked: the userinfo follows a change)."""

    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "profile"}  # noqa: RUF012 (as the base class)

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.get_username(),
            "email": user.email,
            "groups": sorted(Group.objects.filter(user=user).values_list("name", flat=True)),
        }
