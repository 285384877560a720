"""Fixtures of the worker job tests: the shared demo server behind a recording proxy, registered as a server;
an operator and an approver."""

import pytest

from taskhub.servers.services import create_server
from tests.wire_recorder import WireRecorder


@pytest.fixture(scope="module")
def demo(shared_demo_server):
    return shared_demo_server


@pytest.fixture(scope="module")
def recorder(demo):
    proxy = WireRecorder(demo.url).start()
    yield proxy
    proxy.stop()


@pytest.fixture
def server(recorder):
    return create_server(name="demo", transport="http", url=recorder.url, user=None)


@pytest.fixture
def operator(django_user_model):
    return django_user_model.objects.create_user("olga")


@pytest.fixture
def approver(django_user_model):
    return django_user_model.objects.create_user("abe")
