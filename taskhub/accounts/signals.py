"""Signals of the accounts layer that layers above it follow (taskhub.live.access closes sockets on them)."""

from django.dispatch import Signal

# A session's roles were changed by its identity provider (taskhub.accounts.sso): kwargs user_id, session_key.
# Sent after the commit that changed them.
session_roles_changed = Signal()
