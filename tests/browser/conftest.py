from pathlib import Path

import pytest
from browser_fixtures import browser, daphne_server, new_page, page  # noqa: F401 - fixtures for this folder

BROWSER_TESTS = Path(__file__).parent


def pytest_collection_modifyitems(items):
    # Every test here drives Chromium, so `-m "not browser"` leaves the folder out.
    for item in items:
        if item.path.is_relative_to(BROWSER_TESTS):
            item.add_marker(pytest.mark.browser)
