"""The chat page at `/` in a real browser: Debian's Chromium, headless, driven by Playwright for Python.

The page talks to a real server of the tiny model. Where a test needs a reply no random model will
write (Markdown carrying an XSS attempt, reasoning), the browser is handed a canned chat/completions
stream, and the page's own code renders it. The browser tests skip, saying why, where Playwright or
Chromium is not installed (`pip install playwright`, `apt-get install chromium`).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.e2e.raw_clients import wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

pytestmark = pytest.mark.slow

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # A microphone that plays a tone and needs no permission prompt, for the voice button's test.
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]
KEY = "sk-page-test"
LONG = 2000
NOTICE = 30.0
WAIT_MS = 60_000
# Each open page's script errors and CSP refusals, by id(page); the `page` fixture fails a test that leaves any.
FAULTS: dict[int, list[str]] = {}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Playwright for Python is not installed (pip install playwright)")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no Chromium found (Debian: apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context()
    opened = context.new_page()
    # Any script error, or anything the page tried that its CSP refused, fails the test that caused it.
    faults = FAULTS.setdefault(id(opened), [])
    opened.on("pageerror", lambda error: faults.append(f"script error: {error}"))
    opened.on(
        "console", lambda message: faults.append(message.text) if "Content Security Policy" in message.text else None
    )
    yield opened
    context.close()
    del FAULTS[id(opened)]
    assert faults == [], faults


def open_page(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    page.goto(f"{server.base_url}/")
    expect(page.locator("#model option")).not_to_have_count(0, timeout=WAIT_MS)


def send(page: Page, text: str, *, max_tokens: int) -> None:
    page.click("#settings summary")
    # Greedy: sampled (the page's default 0.7), a random model's reply may end on an EOS or open a think section
    # before it writes any text.
    page.fill("#temperature", "0")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", text)
    page.click("#send")


def test_the_page_and_its_assets_have_strict_headers(server: Server) -> None:
    response = loopback.get(f"{server.base_url}/", timeout=10)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy and "unsafe-inline" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assets = [part.split('"')[0] for part in response.text.split('src="/assets/')[1:]]
    assert assets and all(len(name.split(".")[-2]) == 16 for name in assets), assets
    script = loopback.get(f"{server.base_url}/assets/{assets[0]}", timeout=10)
    assert script.status_code == 200 and "immutable" in script.headers["cache-control"]
    assert loopback.get(f"{server.base_url}/assets/chat.js", timeout=10).status_code == 404
    assert loopback.get(f"{server.base_url}/no-such-page", timeout=10).status_code == 404


def test_no_web_turns_the_page_off(server_factory: ServerFactory) -> None:
    quiet = server_factory(web="0")
    assert loopback.get(f"{quiet.base_url}/", timeout=10).status_code == 404


def test_the_page_lists_models_and_streams_a_reply(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    open_page(page, server)
    served = [model["id"] for model in loopback.get(f"{server.v1}/models", timeout=10).json()["data"]]
    assert page.eval_on_selector_all("#model option", "options => options.map(o => o.value)") == served
    send(page, "Hello there.", max_tokens=12)
    expect(page.locator(".message.assistant .meta")).to_contain_text("TTFT", timeout=WAIT_MS)
    assert page.inner_text(".message.assistant .content").strip()


def test_stop_aborts_the_stream_and_the_server_drops_the_row(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    def no_early_end(route: Route) -> None:
        # The page's own request, made long: a random model may otherwise end it early with an EOS.
        body = json.loads(route.request.post_data or "{}")
        route.continue_(post_data=json.dumps({**body, "ignore_eos": True}))

    open_page(page, server)
    page.route("**/v1/chat/completions", no_early_end)
    before = stats(server)
    send(page, "Tell me a long story.", max_tokens=LONG)
    expect(page.locator(".message.assistant .content")).not_to_be_empty(timeout=WAIT_MS)
    page.click("#stop")
    expect(page.locator(".message.assistant .meta")).to_contain_text("stopped", timeout=WAIT_MS)
    idle = wait_for(
        server,
        lambda figures: figures["gateway"]["active"] == 0 and figures["sink_rows"] == 0,  # type: ignore[index]
        timeout=NOTICE,
        what="the stopped stream's row left the batch",
    )
    generated = idle["gateway"]["generated_tokens"] - before["gateway"]["generated_tokens"]  # type: ignore[index]
    assert generated < LONG / 2, f"the stream ran on after the page stopped it: {generated} tokens"


HOSTILE = (
    "Look: <img src=x onerror=\"document.title='pwned'\"> and <script>document.title='pwned'</script>\n\n"
    '[click](javascript:document.title=\'pwned\') <a href="javascript:alert(1)" onclick="alert(1)">there</a>\n\n'
    "```python\nprint('<b>code</b>')\n```\n"
)


def canned_stream(reasoning: str, content: str) -> str:
    chunks = [{"reasoning_content": reasoning}, *({"content": content[i : i + 40]} for i in range(0, len(content), 40))]
    frames = [
        {"object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, "delta": part}]}
        for part in chunks
    ]
    return "".join(f"data: {json.dumps(frame)}\n\n" for frame in frames) + "data: [DONE]\n\n"


def test_hostile_markdown_is_rendered_inert_and_reasoning_folds(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    def canned(route: Route) -> None:
        route.fulfill(status=200, content_type="text/event-stream", body=canned_stream("Thinking it over.", HOSTILE))

    open_page(page, server)
    page.route("**/v1/chat/completions", canned)
    send(page, "Anything.", max_tokens=8)
    content = page.locator(".message.assistant .content")
    expect(content.locator("pre code")).to_contain_text("print('<b>code</b>')", timeout=WAIT_MS)
    assert content.locator("img, script, b").count() == 0
    handlers = content.evaluate(
        "c => [...c.querySelectorAll('*')].flatMap(e => e.getAttributeNames()).filter(n => n.startsWith('on'))"
    )
    assert handlers == []
    hrefs = content.evaluate("c => [...c.querySelectorAll('a')].map(a => a.getAttribute('href'))")
    assert not any(href and href.strip().lower().startswith("javascript:") for href in hrefs), hrefs
    assert page.title() != "pwned"
    # DOMPurify parses the hostile HTML before it drops the handlers, and Chromium's CSP refuses them there:
    # the policy doing its work, the only refusals a page may meet.
    refused = FAULTS[id(page)]
    assert all("inline event handler" in fault for fault in refused), refused
    refused.clear()
    reasoning = page.locator(".message.assistant details.reasoning")
    expect(reasoning).to_be_visible()
    assert reasoning.get_attribute("open") is None
    expect(reasoning.locator(".body")).to_have_text("Thinking it over.")


@pytest.fixture(scope="module")
def keyed(server_factory: ServerFactory) -> Server:
    return server_factory(api_key=KEY)


def test_a_server_with_keys_asks_for_one_and_keeps_it_for_the_tab(page: Page, keyed: Server) -> None:
    from playwright.sync_api import expect

    page.goto(f"{keyed.base_url}/")
    expect(page.locator("#key-prompt")).to_be_visible(timeout=WAIT_MS)
    page.fill("#key", "wrong")
    page.click("#key-form button")
    expect(page.locator("#key-error")).not_to_be_empty(timeout=WAIT_MS)
    page.fill("#key", KEY)
    page.click("#key-form button")
    expect(page.locator("#model option")).not_to_have_count(0, timeout=WAIT_MS)
    expect(page.locator("#key-prompt")).to_be_hidden()
    assert page.evaluate("() => sessionStorage.getItem('mlx-relay.api-key')") == KEY
    assert page.evaluate("() => localStorage.length") == 0
    send(page, "Hello.", max_tokens=4)
    expect(page.locator(".message.assistant .meta")).to_contain_text("TTFT", timeout=WAIT_MS)
