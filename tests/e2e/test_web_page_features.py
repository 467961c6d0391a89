"""The chat page's features in Debian's Chromium, as a person uses them: images, acting on a reply,
conversations kept in the browser, and voice. Fixtures and the browser come from `test_web_page.py`;
like it, these skip, saying why, where Playwright or Chromium is not installed.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import Server, ServerFactory
from tests.e2e.images import encoded, picture
from tests.e2e.test_web_page import WAIT_MS, browser, open_page, page, send  # noqa: F401 (fixtures)

if TYPE_CHECKING:
    from playwright.sync_api import Page, Request, Route

pytestmark = pytest.mark.slow

CODE = "def greet(name):\n    return f'hello {name}'"


def canned_reply(content: str) -> str:
    frame = {"object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, "delta": {}}]}
    frame["choices"] = [{"index": 0, "delta": {"content": content}}]
    return f"data: {json.dumps(frame)}\n\ndata: [DONE]\n\n"


def paste_image(page: Page, png: bytes) -> None:
    """A paste into the composer carrying an image file, as a clipboard would hand it over."""
    page.eval_on_selector(
        "#prompt",
        """(field, encoded) => {
            const bytes = Uint8Array.from(atob(encoded), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            transfer.items.add(new File([bytes], "pasted.png", { type: "image/png" }));
            const paste = new ClipboardEvent("paste", { clipboardData: transfer, bubbles: true, cancelable: true });
            field.dispatchEvent(paste);
        }""",
        base64.b64encode(png).decode(),
    )


@pytest.fixture(scope="module")
def vision(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny,tiny-vl")


def test_images_attach_and_paste_with_thumbnails_on_a_vision_model_only(
    page: Page, vision: Server, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    # Loaded, so that its card says it reads images (a fleet's unloaded card cannot say yet).
    loaded = vision.client().chat.completions.create(
        model="tiny-vl", max_tokens=1, messages=[{"role": "user", "content": "Hi"}]
    )
    assert loaded.choices
    open_page(page, vision)
    page.select_option("#model", "tiny")
    expect(page.locator("#attach")).to_be_hidden()
    page.select_option("#model", "tiny-vl")
    expect(page.locator("#attach")).to_be_visible()
    paste_image(page, encoded(picture(1)))
    (tmp_path / "second.png").write_bytes(encoded(picture(2)))
    page.set_input_files("#image-input", str(tmp_path / "second.png"))
    expect(page.locator("#attachments img")).to_have_count(2)
    with page.expect_request("**/v1/chat/completions") as sent:
        send(page, "What is in these pictures?", max_tokens=4)
    content = json.loads(sent.value.post_data or "{}")["messages"][-1]["content"]
    assert [part["type"] for part in content] == ["text", "image_url", "image_url"]
    assert all(part["image_url"]["url"].startswith("data:image/png;base64,") for part in content[1:])
    expect(page.locator(".message.assistant .meta")).to_contain_text("tokens", timeout=WAIT_MS)
    assert page.locator(".message.assistant .error").count() == 0
    expect(page.locator(".message.user .thumbs img")).to_have_count(2)
    expect(page.locator("#attachments img")).to_have_count(0)


def test_copy_regenerate_and_edit_and_resend(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    bodies: list[dict[str, Any]] = []

    def canned(route: Route) -> None:
        bodies.append(json.loads(route.request.post_data or "{}"))
        reply = f"Reply {len(bodies)}.\n\n```python\n{CODE}\n```\n"
        route.fulfill(status=200, content_type="text/event-stream", body=canned_reply(reply))

    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    open_page(page, server)
    page.route("**/v1/chat/completions", canned)
    send(page, "Write a greeting.", max_tokens=8)
    reply = page.locator(".message.assistant")
    expect(reply.locator(".content")).to_contain_text("Reply 1.", timeout=WAIT_MS)
    # The reply is drawn again with its actions once it has ended: wait for that before acting on it.
    expect(reply.get_by_role("button", name="Regenerate")).to_be_visible()
    assert reply.locator("pre code.hljs .hljs-keyword").count() > 0, "the code block is not highlighted"
    copy_code = reply.get_by_role("button", name="Copy code")
    copy_code.click()
    expect(copy_code).to_have_text("Copied")  # the clipboard's write has finished
    assert page.evaluate("() => navigator.clipboard.readText()") == CODE
    copy = reply.get_by_role("button", name="Copy message")
    copy.click()
    expect(copy).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()").startswith("Reply 1.")

    reply.get_by_role("button", name="Regenerate").click()
    expect(reply.locator(".content")).to_contain_text("Reply 2.", timeout=WAIT_MS)
    expect(reply.get_by_role("button", name="Regenerate")).to_be_visible()
    expect(reply).to_have_count(1)
    assert [m["role"] for m in bodies[1]["messages"]] == ["user"], "the regenerated request still held the old reply"

    page.locator(".message.user").get_by_role("button", name="Edit").click()
    page.get_by_label("Edit message").fill("Write a farewell.")
    page.locator(".message.user").get_by_role("button", name="Send").click()
    expect(reply.locator(".content")).to_contain_text("Reply 3.", timeout=WAIT_MS)
    assert bodies[2]["messages"] == [{"role": "user", "content": "Write a farewell."}]
    expect(page.locator(".message.user .content")).to_have_text("Write a farewell.")


def test_conversations_are_kept_in_the_browser_renamed_exported_and_deleted(page: Page, server: Server) -> None:
    from playwright.sync_api import expect

    asked: list[Request] = []
    page.on("request", lambda request: asked.append(request))
    open_page(page, server)
    expect(page.locator("#mic")).to_be_hidden()
    send(page, "Remember this question.", max_tokens=4)
    expect(page.locator(".message.assistant .meta")).to_contain_text("tokens", timeout=WAIT_MS)
    chats = page.locator("#chats li")
    expect(chats).to_have_count(1)

    page.reload()
    expect(chats.locator(".open")).to_have_text(["Remember this question."], timeout=WAIT_MS)
    expect(page.locator(".message")).to_have_count(0)
    chats.locator(".open").click()
    expect(page.locator(".message.user .content")).to_have_text("Remember this question.")
    page.once("dialog", lambda dialog: dialog.accept("Kept"))
    chats.get_by_role("button", name="Rename").click()
    expect(chats.locator(".open")).to_have_text(["Kept"])

    with page.expect_download() as markdown:
        page.click("#export-md")
    text = Path(markdown.value.path()).read_text()
    assert text.startswith("# Kept") and "Remember this question." in text
    with page.expect_download() as exported:
        page.click("#export-json")
    saved = json.loads(Path(exported.value.path()).read_text())
    assert saved["title"] == "Kept" and saved["messages"][0] == {"role": "user", "content": "Remember this question."}
    assert saved["messages"][1]["role"] == "assistant"

    page.once("dialog", lambda dialog: dialog.accept())
    chats.get_by_role("button", name="Delete").click()
    expect(chats).to_have_count(0)
    page.reload()
    expect(page.locator("#model option")).not_to_have_count(0, timeout=WAIT_MS)
    expect(chats).to_have_count(0)
    paths = {urlsplit(request.url).path for request in asked if not request.url.startswith(("blob:", "data:"))}
    assert {path for path in paths if not path.startswith("/assets/")} == {"/", "/v1/models", "/v1/chat/completions"}


@pytest.fixture(scope="module")
def speaking(server_factory: ServerFactory) -> Server:
    return server_factory(model="tiny,tiny-whisper")


def test_the_microphone_records_and_transcribes_on_the_speech_model(page: Page, speaking: Server) -> None:
    from playwright.sync_api import expect

    open_page(page, speaking)
    assert "tiny-whisper" not in page.eval_on_selector_all("#model option", "options => options.map(o => o.value)")
    mic = page.locator("#mic")
    expect(mic).to_be_visible()
    mic.click()
    expect(mic).to_have_attribute("aria-pressed", "true")
    # Chromium's fake microphone plays a tone; a second of it is enough to decode.
    page.wait_for_function("() => Number(document.getElementById('mic').dataset.seconds) >= 1", timeout=WAIT_MS)
    with page.expect_response("**/v1/audio/transcriptions", timeout=WAIT_MS) as answered:
        mic.click()
        expect(page.locator("#status")).to_contain_text("Transcrib", timeout=WAIT_MS)
    assert answered.value.status == 200, answered.value.text()
    expect(page.locator("#status")).to_contain_text("Transcribed", timeout=WAIT_MS)
    expect(mic).to_have_attribute("aria-pressed", "false")
