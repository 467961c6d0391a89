"""The prompt side's image checks, the prompt cache's image keys and tiny-vl's vision tower, without a server."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipeline.errors import RequestError
from pipeline.requests import ImagePart
from stages.messages import PromptImage
from stages.model_thread.encoder_cache import EncoderCache
from stages.model_thread.vision_rows import keyed
from stages.prompt.images import ImageLimits, decode
from tests.e2e.images import encoded, picture

OPEN = ImageLimits(max_bytes=1 << 20, max_pixels=1 << 20, url_hosts=frozenset({"*"}))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/cat.png",
        "http://localhost:8000/cat.png",
        "http://169.254.169.254/latest/meta-data",
        "http://10.1.2.3/cat.png",
        "http://[::1]/cat.png",
        "http://192.168.0.7/cat.png",
    ],
)
def test_an_allowed_url_is_never_fetched_from_a_private_address(url: str) -> None:
    with pytest.raises(RequestError) as caught:
        decode(ImagePart(param="messages[0].content[0]", offset=0, url=url), OPEN)
    assert caught.value.code == "image_url_refused" and caught.value.param == "messages[0].content[0]"


def test_a_host_off_the_allow_list_is_refused() -> None:
    limits = ImageLimits(max_bytes=1 << 20, max_pixels=1 << 20, url_hosts=frozenset({"images.example.org"}))
    with pytest.raises(RequestError) as caught:
        decode(ImagePart(param="p", offset=0, url="https://example.com/cat.png"), limits)
    assert caught.value.code == "image_url_refused" and "example.com" in caught.value.message


def test_urls_are_off_without_an_allow_list() -> None:
    limits = ImageLimits(max_bytes=1 << 20, max_pixels=1 << 20)
    with pytest.raises(RequestError) as caught:
        decode(ImagePart(param="p", offset=0, url="https://example.com/cat.png"), limits)
    assert caught.value.code == "image_url_refused"


def test_the_same_pixels_in_two_formats_have_one_digest() -> None:
    scene = picture(3)
    png = decode(ImagePart(param="p", offset=0, data=encoded(scene)), OPEN)
    webp = decode(ImagePart(param="p", offset=0, data=_lossless_webp(scene)), OPEN)
    other = decode(ImagePart(param="p", offset=0, data=encoded(picture(4))), OPEN)
    assert png.digest == webp.digest != other.digest


def test_a_file_over_the_byte_cap_is_refused_before_decoding() -> None:
    limits = ImageLimits(max_bytes=100, max_pixels=1 << 20)
    with pytest.raises(RequestError) as caught:
        decode(ImagePart(param="p", offset=0, data=encoded(picture())), limits)
    assert caught.value.code == "image_too_large"


def test_prompt_cache_keys_tell_pictures_apart_and_keep_text() -> None:
    image_token = 5
    tokens = [1, 2, image_token, image_token, 3]
    first = PromptImage(digest=b"a" * 32, tokens=2, pixels=None)
    second = PromptImage(digest=b"b" * 32, tokens=2, pixels=None)
    key_a, key_b = keyed(tokens, [first], image_token), keyed(tokens, [second], image_token)
    assert key_a[:2] == key_b[:2] == (1, 2) and key_a[-1] == key_b[-1] == 3
    assert key_a[2:4] != key_b[2:4] and key_a == keyed(tokens, [first], image_token)
    assert all(1 << 30 <= key < 1 << 31 for key in key_a[2:4])


def test_the_encoder_cache_evicts_the_least_recently_used() -> None:
    cache = EncoderCache(max_bytes=2 * 400)
    first, second, third = (np.zeros((10, 10), np.float32) for _ in range(3))
    cache.put(b"1", first)
    cache.put(b"2", second)
    assert cache.get(b"1") is first
    cache.put(b"3", third)
    assert cache.get(b"2") is None and cache.get(b"1") is first and cache.get(b"3") is third
    figures = cache.statistics()
    assert (figures.entries, figures.evictions, figures.hits, figures.misses) == (2, 1, 3, 1)


def _lossless_webp(image: Image.Image) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, "WEBP", lossless=True, exact=True)
    return buffer.getvalue()


def test_an_image_crosses_to_the_worker_as_uint8_tiles() -> None:
    import msgspec

    from stages.remote.convert import image_in, prompt_image
    from stages.remote.crossing import ImageIn

    tiles = np.random.default_rng(0).integers(0, 256, size=(5, 3, 128, 128), dtype=np.uint8)
    sent = PromptImage(digest=b"d" * 32, tokens=80, pixels=tiles)
    wire = msgspec.msgpack.encode(image_in(sent))
    # A quarter of what float32 tiles would take, plus the frame's few bytes.
    assert len(wire) < tiles.size + 200
    received = prompt_image(msgspec.msgpack.decode(wire, type=ImageIn))
    assert received.digest == sent.digest and received.tokens == 80
    assert np.array_equal(received.pixels, tiles)
