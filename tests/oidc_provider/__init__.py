"""A real OpenID Connect provider for the single sign-on tests: django-oauth-toolkit's, in a Django project of its own
(sqlite), served by `runserver` in a process of its own (tests/browser/test_sso.py). `python -m tests.oidc_provider`
sets it up (users, groups, taskhub's client) and changes a person's groups, as the provider's admin would."""
