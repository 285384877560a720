"""The README's screenshots: every image in docs/screenshots is shown by the README, and every image the README
shows from there exists (a screenshot left behind goes stale unseen, as task-detail.png once did)."""

import re
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent.parent
SCREENSHOTS = PROJECT_DIR / "docs" / "screenshots"


def test_the_readme_shows_every_screenshot_and_each_one_it_shows_exists():
    readme = (PROJECT_DIR / "README.md").read_text()
    shown = set(re.findall(r"!\[[^\]]*\]\(docs/screenshots/([^)\s]+)\)", readme))
    on_disk = {path.name for path in SCREENSHOTS.iterdir() if path.is_file()}
    assert shown, "the README shows no screenshot"
    assert on_disk - shown == set(), "in docs/screenshots but not in the README"
    assert shown - on_disk == set(), "in the README but not in docs/screenshots"
    for name in on_disk:
        assert (SCREENSHOTS / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
