"""The task list on desktop widths (issue 34, item 1): at 1024, 1280 and 1440 px, with long tool and server names and
rows of every kind, no cell's text runs out of its cell (into the next one, or clipped by it) and the server that ran
each task can be read whole. The 390 px check (test_accessibility) does not see this: the table clips inside its own
box, so the page's width stays right."""

import datetime

import pytest
from django.utils import timezone

from taskhub.accounts.groups import OPERATORS
from taskhub.servers.models import Server, Transport
from taskhub.tasks.models import Task, TaskStatus
from tests.account_fixtures import TEST_PASSWORD, make_user
from tests.browser_fixtures import sign_in

pytestmark = pytest.mark.slow

SERVERS = ("payments-reconciliation-eu-west-1", "customer-identity-provisioning")
TOOLS = ("rotate_customer_encryption_keys", "reconcile_ledger_entries_for_month", "deploy")
WIDTHS = (1024, 1280, 1440)

# For each cell of each row and of the head: where its text lies beyond its own box (a text's layout, clipped or
# not, is what a Range measures). The message cell clips its one line on purpose (its whole text is on hover): there,
# its lines' boxes must stay inside it. The server names: their text wholly inside their link and their cell.
MEASURE = """() => {
  const inside = (inner, outer) =>
    inner.left >= outer.left - 1 && inner.right <= outer.right + 1 && inner.top >= outer.top - 1
    && inner.bottom <= outer.bottom + 1;
  const textBox = (node) => { const range = document.createRange(); range.selectNodeContents(node);
    return range.getBoundingClientRect(); };
  const out = [];
  for (const cell of document.querySelectorAll(".task-table th:not(.task-pick), .task-table td")) {
    const box = cell.getBoundingClientRect();
    const what = `${cell.closest("tr").id || "head"} / ${cell.dataset.label || cell.textContent.trim()}`;
    if (cell.classList.contains("task-message")) {
      for (const line of cell.querySelectorAll(".oneline")) {
        if (!inside(line.getBoundingClientRect(), box)) out.push(`${what}: a line leaves the cell`);
      }
    } else if (cell.textContent.trim() && !inside(textBox(cell), box)) {
      out.push(`${what}: "${cell.innerText.trim()}" leaves its cell`);
    }
  }
  for (const server of document.querySelectorAll(".task-what .server")) {
    const text = textBox(server);
    if (!inside(text, server.closest("a").getBoundingClientRect()) || !inside(text, server.closest("td")
      .getBoundingClientRect())) out.push(`server name "${server.textContent}" is cut`);
  }
  return out;
}"""


def a_list_of_long_names():
    olga = make_user("olga", OPERATORS, password=TEST_PASSWORD)
    servers = [
        Server.objects.create(name=name, transport=Transport.HTTP, url=f"http://{index}.example/mcp")
        for index, name in enumerate(SERVERS)
    ]
    now = timezone.now()
    kinds = [
        (TaskStatus.WORKING, None, {}),
        (TaskStatus.INPUT_REQUIRED, None, {}),
        (TaskStatus.COMPLETED, 4.2, {"result": {"content": [{"type": "text", "text": "rotated 12 keys " * 20}]}}),
        (TaskStatus.FAILED, 3725, {"error": {"code": -32603, "message": "the vault refused"}}),
        (TaskStatus.CANCELLED, 93784, {"cancel_requested_by": olga}),
        (TaskStatus.LAUNCH_UNKNOWN, None, {}),
    ]
    for index in range(12):
        status, took, fields = kinds[index % len(kinds)]
        started = now - datetime.timedelta(minutes=9 + 50 * index)
        task = Task.objects.create(
            server=servers[index % 2],
            tool=TOOLS[index % len(TOOLS)],
            launched_by=olga,
            status=status,
            status_message="re-encrypting the tenant's keys one shard at a time " * 4,
            **fields,
        )
        finished = started + datetime.timedelta(seconds=took) if took is not None else None
        Task.objects.filter(pk=task.pk).update(created_at=started, updated_at=finished or now, finished_at=finished)


def test_the_list_fits_its_cells_and_names_the_server_at_desktop_widths(daphne_server, page):
    a_list_of_long_names()
    sign_in(page, daphne_server.url, "olga", TEST_PASSWORD)
    problems = {}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 900})
        page.goto(f"{daphne_server.url}/tasks/")
        assert page.locator(".task-row").count() == 12
        if found := page.evaluate(MEASURE):
            problems[width] = found
    assert problems == {}, "\n".join(f"{width}: {line}" for width, lines in problems.items() for line in lines)
