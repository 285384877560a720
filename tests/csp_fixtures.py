"""A small world with one of every page's subject, for the CSP tests (test client and browser)."""

import base64
import struct
import zlib
from dataclasses import dataclass

from django.utils import timezone

from taskhub.accounts.groups import ADMINS, APPROVERS, OPERATORS
from taskhub.mcp.client import TaskCreated, ToolCompleted
from taskhub.servers.models import Server
from taskhub.servers.services import create_server
from taskhub.tasks import services
from taskhub.tasks.models import InputRequest
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.helpers import snapshot

TOOL = {
    "name": "deploy",
    "description": "Deploys a service.",
    "execution": {"taskSupport": "optional"},
    "inputSchema": {
        "type": "object",
        "properties": {"target": {"type": "string", "enum": ["staging", "prod"]}, "note": {"type": "string"}},
        "required": ["target"],
    },
}
QUESTION = {
    "method": "elicitation/create",
    "params": {
        "message": "Approve deploy to staging?",
        "requestedSchema": {
            "type": "object",
            "properties": {"ok": {"type": "boolean", "title": "Approve"}, "why": {"type": "string"}},
        },
    },
}


def png(width: int = 40, height: int = 20) -> str:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes((40, 120, 200)) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return base64.b64encode(data).decode()


@dataclass
class World:
    admin: object
    server: Server
    image_task: object
    asking_task: object
    input_request: InputRequest

    def pages(self) -> list[str]:
        """Every page an admin who approves and operates can open, one of each kind."""
        s = self.server.pk
        return [
            "/",
            "/tasks/",
            f"/tasks/{self.image_task.pk}/",
            f"/tasks/{self.asking_task.pk}/",
            "/inbox/",
            "/launch/",
            f"/launch/{s}/deploy/",
            "/servers/",
            "/servers/add/",
            f"/servers/{s}/",
            f"/servers/{s}/edit/",
            "/audit/",
            "/admin/",
            "/admin/auth/user/",
            f"/admin/auth/user/{self.admin.pk}/change/",
            "/admin/auth/group/add/",
            "/api/docs",
        ]


def build_world(password: str | None = TEST_PASSWORD) -> World:
    admin = make_user("alex", ADMINS, APPROVERS, OPERATORS, password=password, is_staff=True, is_superuser=True)
    server = create_server(name="demo", transport="http", url="http://127.0.0.1:9/mcp", user=admin)
    Server.objects.filter(pk=server.pk).update(tools=[TOOL], discovered_at=timezone.now())
    server.refresh_from_db()

    image_task = services.launch(server=server, tool="deploy", arguments={"target": "staging"}, user=admin)
    image_task = services.record_launch_outcome(
        task=image_task,
        outcome=ToolCompleted(
            result={
                "content": [
                    {"type": "text", "text": "Rendered the chart."},
                    {"type": "image", "data": png(), "mimeType": "image/png"},
                ]
            }
        ),
    )

    asking = services.launch(server=server, tool="deploy", arguments={"target": "prod"}, user=admin)
    asking = services.record_launch_outcome(
        task=asking, outcome=TaskCreated(task=snapshot(task_id="r-ask", ttl_ms=3_600_000))
    )
    services.apply_snapshot(
        task=asking,
        snapshot=snapshot("input_required", task_id="r-ask", ttl_ms=3_600_000, inputRequests={"approve": QUESTION}),
    )
    input_request = InputRequest.objects.get(task=asking, key="approve")
    return World(admin, server, image_task, asking, input_request)
