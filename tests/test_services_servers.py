"""Server services: every change audited in its transaction, health audited only when it turns."""

import pytest

from taskhub.audit.models import AuditEvent
from taskhub.mcp.client import Discovery
from taskhub.servers.errors import ServerConfigInvalid
from taskhub.servers.models import Server
from taskhub.servers.services import (
    create_server,
    record_discovery,
    record_server_failure,
    record_server_success,
    update_server,
)

pytestmark = pytest.mark.django_db


def actions(server) -> list[str]:
    return list(AuditEvent.objects.filter(server=server).order_by("id").values_list("action", flat=True))


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_user("admin")


@pytest.fixture
def server(admin):
    return create_server(
        name="demo", transport="http", url="http://127.0.0.1:8765/mcp", bearer_token="s3cret", user=admin
    )


def test_create_server_audits_who_registered_it_without_its_secrets(server):
    event = AuditEvent.objects.get(server=server)
    assert (event.action, event.actor_label) == ("server.created", "admin")
    assert event.data == {"name": "demo", "transport": "http", "endpoint": "http://127.0.0.1:8765/mcp"}
    assert "s3cret" not in str(event.data)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"transport": "http", "url": ""}, "__all__"),
        ({"transport": "stdio", "command": ""}, "__all__"),
        ({"transport": "http", "url": "not a url"}, "url"),
        ({"transport": "carrier-pigeon", "url": "http://x.example/mcp"}, "transport"),
    ],
)
def test_create_server_refuses_incomplete_settings_with_the_field_named(settings, field):
    with pytest.raises(ServerConfigInvalid) as refused:
        create_server(name="bad", user=None, **settings)
    assert field in refused.value.messages
    assert not Server.objects.filter(name="bad").exists()
    assert not AuditEvent.objects.exists()


def test_names_are_unique(server):
    with pytest.raises(ServerConfigInvalid, match="name"):
        create_server(name="demo", transport="http", url="http://127.0.0.1:1/mcp", user=None)


def test_update_server_names_changed_fields_and_hides_secret_values(server, admin):
    update_server(server=server, user=admin, enabled=False, bearer_token="n3w")
    event = AuditEvent.objects.get(server=server, action="server.updated")
    assert event.data["changed"] == {"enabled": False, "bearer_token": "(secret changed)"}
    server = Server.objects.get(pk=server.pk)
    assert (server.enabled, server.bearer_token) == (False, "n3w")


def test_update_server_without_a_change_writes_nothing(server, admin):
    update_server(server=server, user=admin, enabled=True, bearer_token="s3cret")
    assert actions(server) == ["server.created"]


def test_update_server_refuses_fields_it_does_not_own(server, admin):
    with pytest.raises(TypeError, match="tools"):
        update_server(server=server, user=admin, tools=[])


def test_record_discovery_stores_capabilities_tools_and_health(server):
    discovery = Discovery(
        protocol_version="2026-07-28",
        server_info={"name": "demo", "version": "1"},
        capabilities={"tools": {}, "extensions": {"io.modelcontextprotocol/tasks": {}}},
        tools=[{"name": "slow_compute", "inputSchema": {"type": "object"}}],
        raw={},
    )
    record_discovery(server=server, discovery=discovery)
    server = Server.objects.get(pk=server.pk)
    assert server.tools == [{"name": "slow_compute", "inputSchema": {"type": "object"}}]
    assert server.capabilities["extensions"] == {"io.modelcontextprotocol/tasks": {}}
    assert server.discovered_at is not None and server.last_success_at is not None
    event = AuditEvent.objects.get(server=server, action="server.discovered")
    assert (event.actor_label, event.data["tools"], event.data["supports_tasks"]) == ("worker", ["slow_compute"], True)


def test_health_is_audited_when_it_turns_not_on_every_request(server):
    record_server_failure(server=server, error="connection refused")
    first_down = Server.objects.get(pk=server.pk).unreachable_since
    record_server_failure(server=server, error="connection refused again")
    server.refresh_from_db()
    assert (server.unreachable_since, server.last_error) == (first_down, "connection refused again")
    assert not server.is_reachable

    record_server_success(server=server)
    record_server_success(server=server)
    server.refresh_from_db()
    assert server.is_reachable and server.last_success_at is not None
    assert actions(server) == ["server.created", "server.unreachable", "server.reachable"]
