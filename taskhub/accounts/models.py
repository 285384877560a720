from django.conf import settings
from django.db import models


class Profile(models.Model):
    """A person's own choices that are not about notifications: for now the language taskhub speaks to them.

    An empty language means the browser's (Accept-Language, through Django's LocaleMiddleware)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, primary_key=True, related_name="profile"
    )
    language = models.CharField(max_length=16, blank=True, default="", choices=settings.LANGUAGES)

    def __str__(self) -> str:
        return f"profile of {self.user_id}"
