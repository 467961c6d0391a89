"""Each bad image is a 400 in its API's error shape naming the part, and never reaches the model.

The image server (`tests/e2e/images.py`: `tiny-vl`, a 250 000-pixel cap, three images a request) is
the one `test_images.py` uses; the text model's server is the shared `server`.
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest
from PIL import Image

from tests import loopback
from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.e2e.images import MAX_IMAGES, b64, data_url, encoded, image_server, picture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def vl(server_factory: ServerFactory) -> Server:
    return image_server(server_factory)


def chat_error(server: Server, parts: list[dict[str, Any]]) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model="m", max_tokens=2, messages=[{"role": "user", "content": [{"type": "text", "text": "Look:"}, *parts]}]
        )
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    return body


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


BOMB = encoded(Image.new("L", (1000, 1000)))

BAD_CHAT_IMAGES = {
    "undecodable": (image_part(data_url(b"this is not a picture at all")), "invalid_image"),
    "pixel bomb": (image_part(data_url(BOMB)), "image_too_large"),
    "media type": (image_part(data_url(encoded(picture()), "image/bmp")), "unsupported_media_type"),
    "bmp bytes": (image_part(data_url(encoded(picture(), "BMP"))), "invalid_image"),
    "declared jpeg": (image_part(data_url(encoded(picture()), "image/jpeg")), "invalid_image"),
    "remote url": (image_part("https://example.com/cat.png"), "image_url_refused"),
}


@pytest.mark.parametrize("case", sorted(BAD_CHAT_IMAGES))
def test_chat_names_the_bad_image_part(vl: Server, case: str) -> None:
    part, code = BAD_CHAT_IMAGES[case]
    before = stats(vl)["gateway"]
    body = chat_error(vl, [part])
    assert body["param"] == "messages[0].content[1]", body
    assert body["code"] == code, body
    assert "messages[0].content[1]" in body["message"]
    gateway = stats(vl)["gateway"]
    assert isinstance(gateway, dict) and isinstance(before, dict)
    # Never reached the model: no image was encoded for it.
    assert gateway["encoder_cache"]["encoded_images"] == before["encoder_cache"]["encoded_images"]


def test_one_image_too_many_is_named(vl: Server) -> None:
    parts = [image_part(data_url(encoded(picture(seed)))) for seed in range(MAX_IMAGES + 1)]
    body = chat_error(vl, parts)
    assert body["param"] == f"messages[0].content[{MAX_IMAGES + 1}]" and body["code"] == "too_many_images"


def test_a_text_model_refuses_an_image_by_its_part(server: Server) -> None:
    body = chat_error(server, [image_part(data_url(encoded(picture())))])
    assert body["param"] == "messages[0].content[1]" and body["code"] == "image_input_unsupported"


def test_messages_names_the_bad_block(vl: Server) -> None:
    claude = vl.anthropic_client()
    blocks: Any = [
        {"type": "text", "text": "Look:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(b"not a picture")}},
    ]
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(model="m", max_tokens=2, messages=[{"role": "user", "content": blocks}])
    body = caught.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "messages.0.content.1" in body["error"]["message"]


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"type": "input_image", "file_id": "file-abc123"}, "input[0].content[1].file_id"),
        ({"type": "input_image", "image_url": data_url(BOMB)}, "input[0].content[1]"),
    ],
)
def test_responses_names_the_bad_input_image(vl: Server, part: dict[str, Any], param: str) -> None:
    content: Any = [{"type": "input_text", "text": "Look:"}, part]
    with pytest.raises(openai.BadRequestError) as caught:
        vl.client().responses.create(model="m", max_output_tokens=2, input=[{"role": "user", "content": content}])
    body = caught.value.body
    assert isinstance(body, dict) and body["param"] == param, body


def test_completions_refuse_images_by_name(vl: Server) -> None:
    body = {"model": "m", "prompt": "Look:", "max_tokens": 2, "multi_modal_data": {"image": data_url(BOMB)}}
    response = loopback.post(f"{vl.v1}/completions", json=body, timeout=30)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "multi_modal_data"


def test_the_server_keeps_serving_images_after_bad_ones(vl: Server) -> None:
    good = vl.client().chat.completions.create(
        model="m", max_tokens=2, messages=[{"role": "user", "content": [image_part(data_url(encoded(picture(9))))]}]
    )
    assert good.choices[0].finish_reason in ("length", "stop")


def test_a_fleet_serves_images_to_its_vision_model_only(server_factory: ServerFactory) -> None:
    fleet = server_factory(model="tiny,tiny-vl")
    parts: Any = [{"type": "text", "text": "Look:"}, image_part(data_url(encoded(picture(10))))]
    seen = fleet.client().chat.completions.create(
        model="mlx-relay/tiny-vl", max_tokens=2, messages=[{"role": "user", "content": parts}]
    )
    assert seen.usage is not None and seen.usage.prompt_tokens > 80
    with pytest.raises(openai.BadRequestError) as caught:
        fleet.client().chat.completions.create(
            model="mlx-relay/tiny", max_tokens=2, messages=[{"role": "user", "content": parts}]
        )
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "messages[0].content[1]"
