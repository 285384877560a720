"""Browser tests (tests.browser): Playwright driving chromium against a live taskhub; their fixtures in conftest.py."""
