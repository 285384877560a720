"""What the approval rules announce once their transaction has committed; notifications (mail digest, webhooks)
listen. Sent with send_robust from transaction.on_commit, so a failing receiver never undoes what happened.

- deadline_near: input_request_id=<int>, policy_id=<int | None>, deadline=<datetime>
- default_applied: input_request_id=<int>, policy_id=<int | None> (None: the policy was
  removed before the deadline), outcome=<str>: what taskhub did at the deadline
  ("declined", "cancelled", "answered", "escalated", "not approved"; "nothing" when the task could not be cancelled)

Both are sent by taskhub.approvals.deadlines, each once per request.
"""

from django.dispatch import Signal

deadline_near = Signal()
default_applied = Signal()
