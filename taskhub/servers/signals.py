"""What the servers announce once their change has committed (sent with send_robust from transaction.on_commit, so a
failing receiver never undoes it); the notifications listen.

- needs_reauthorization: server_id=<int>, server_name=<str>: a server connected through OAuth could not have its
  token refreshed and waits for an admin to connect it again (sent once per mark, taskhub.servers.oauth_store).
"""

from django.dispatch import Signal

needs_reauthorization = Signal()
