"""Browser tests: a package, so that its conftest.py does not take the name `conftest` from tests/."""
