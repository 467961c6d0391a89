"""The chat page's models view, live view and tool calls in Debian's Chromium, against real servers; each
test also takes its view's screenshot, written into docs/screenshots/ (the README links one) only where
`MLX_RELAY_WRITE_SCREENSHOTS=1` asks, so that a run leaves the checkout as it was. Fixtures and the
browser come from `test_web_page.py`; like it, these skip, saying why, where Playwright or Chromium is not
installed.
"""

from __future__ import annotations

import json
import os
import re
from typing import TYPE_CHECKING

import pytest

from tests.conftest import REPO, Server, ServerFactory
from tests.e2e.test_web_page import WAIT_MS, browser, open_page, page, send  # noqa: F401 (fixtures)

if TYPE_CHECKING:
    from playwright.sync_api import Page, Response, Route

pytestmark = pytest.mark.slow

# The settings tests/e2e/test_fleet.py pins, so that a run starts this fleet once per worker.
FLEET_KEY = "unused"
TINY, DEMO = "mlx-relay/tiny", "mlx-relay/demo"
SHOTS = REPO / "docs" / "screenshots"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER, "strict": True}}]


@pytest.fixture(scope="module")
def pair(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny,demo", api_key=FLEET_KEY, pinned=True)


def screenshot(page: Page, name: str) -> None:
    image = page.screenshot()
    assert image.startswith(b"\x89PNG")
    if os.environ.get("MLX_RELAY_WRITE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        (SHOTS / f"{name}.png").write_bytes(image)


def test_a_forced_tool_call_shows_its_name_and_arguments(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    def with_a_tool(route: Route) -> None:
        # The page offers no tools of its own: its request is handed one, and the call forced.
        body = json.loads(route.request.post_data or "{}")
        forced = {"type": "function", "function": {"name": "get_weather"}}
        route.continue_(post_data=json.dumps({**body, "tools": TOOLS, "tool_choice": forced}))

    page.set_viewport_size({"width": 1000, "height": 560})
    open_page(page, server)
    page.route("**/v1/chat/completions", with_a_tool)
    send(page, "What will the weather be in Paris?", max_tokens=120)
    reply = page.locator(".message.assistant")
    expect(reply.get_by_role("button", name="Regenerate")).to_be_visible(timeout=WAIT_MS)
    expect(reply.locator(".tool-call .name")).to_have_text(["Tool call: get_weather"])
    arguments = json.loads(reply.locator(".tool-call .arguments").inner_text())
    assert set(arguments) == {"city", "days"}, arguments
    page.click("#settings summary")  # folded again for the picture
    screenshot(page, "chat")


def test_the_live_view_counts_a_request_and_shows_the_worker(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 1000, "height": 560})
    open_page(page, server)
    page.click("#tab-live")
    generated = page.locator('#live-figures [data-figure="generated"] .value')
    expect(generated).to_have_text(re.compile(r"^\d+$"), timeout=WAIT_MS)
    before = generated.inner_text()
    model = server.client().models.list().data[0].id
    done = server.client().chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count."}], max_tokens=8, extra_body={"ignore_eos": True}
    )
    assert done.usage is not None and done.usage.completion_tokens == 8
    expect(generated).to_have_text(str(int(before) + 8), timeout=WAIT_MS)
    worker = page.locator("#live-workers tbody tr")
    expect(worker).to_have_count(1)
    expect(worker.locator("td")).to_have_text([model, "ready", re.compile("pid|this process"), "0", "0", "0"])
    # A rate was drawn from the request's tokens.
    expect(page.locator('#live-figures [data-figure="rate"] polyline')).to_have_attribute("points", re.compile(","))
    screenshot(page, "live")


def test_the_models_view_loads_and_drains_asking_for_the_key_on_401(page: Page, pair: Server) -> None:
    from playwright.sync_api import expect

    admin: list[Response] = []
    page.on("response", lambda response: admin.append(response) if "/admin/models/" in response.url else None)
    page.set_viewport_size({"width": 1000, "height": 460})
    page.goto(f"{pair.base_url}/")
    expect(page.locator("#key-prompt")).to_be_visible(timeout=WAIT_MS)
    page.fill("#key", FLEET_KEY)
    page.click("#key-form button")
    expect(page.locator("#model option")).not_to_have_count(0, timeout=WAIT_MS)
    page.click("#tab-models")
    rows = page.locator("#models-table tbody tr")
    expect(rows).to_have_count(2, timeout=WAIT_MS)
    assert [row.get_attribute("data-model") for row in rows.all()] == [TINY, DEMO]
    demo = page.locator(f'#models-table tr[data-model="{DEMO}"]')
    if demo.locator(".state").inner_text() != "unloaded":  # another module's test may have loaded it
        page.get_by_role("button", name=f"Unload {DEMO}", exact=True).click()
        expect(demo.locator(".state")).to_have_text("unloaded", timeout=WAIT_MS)
    admin.clear()

    # The key is gone (another tab's, rotated): the admin route's 401 asks for it, and the load is retried.
    page.evaluate("() => sessionStorage.clear()")
    page.get_by_role("button", name=f"Load {DEMO}", exact=True).click()
    expect(page.locator("#key-prompt")).to_be_visible(timeout=WAIT_MS)
    page.fill("#key", FLEET_KEY)
    page.click("#key-form button")
    expect(demo.locator(".state")).to_have_text("ready", timeout=WAIT_MS)
    assert [(response.status, response.url.split("/")[-1]) for response in admin] == [(401, "load"), (200, "load")]
    expect(demo.locator("td").nth(3)).to_have_text(re.compile(r"^\d+ tokens$"))
    expect(demo.locator("td").nth(2)).to_have_text(re.compile(r"iB$"))
    screenshot(page, "models")

    page.click("#tab-live")
    workers = page.locator("#live-workers tbody tr")
    expect(workers).to_have_count(2, timeout=WAIT_MS)
    expect(page.locator(f'#live-workers tr[data-model="{DEMO}"] td').nth(2)).to_have_text(re.compile(r"^pid \d+$"))
    page.click("#tab-models")
    page.get_by_role("button", name=f"Drain {DEMO}", exact=True).click()
    expect(demo.locator(".state")).to_have_text("unloaded", timeout=WAIT_MS)
