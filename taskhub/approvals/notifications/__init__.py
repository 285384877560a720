"""Mail notifications: who is told of what (recipients.py), the outbox and the digest job's scheduling (outbox.py),
the digest itself (digest.py), the receivers of the domain's signals (receivers.py) and the preferences page.

Events become MailEvent rows in the transaction that records them, with a digest job per person deferred in the same
transaction; the job mails everything that person has waiting in one message, at most once per
TASKHUB_MAIL_DIGEST_SECONDS, and marks the rows sent only once the mail server took the message.
"""
