"""Test pictures made with Pillow at test time, and the image server's settings, for the image tests."""

from __future__ import annotations

import base64
import io

from PIL import Image, ImageDraw

from tests.conftest import Server, ServerFactory

# Small enough that the pixel-bomb test needs no large file; the test pictures are far below it.
MAX_PIXELS = 250_000
MAX_IMAGES = 3
# tiny-vl reads a 200×150 picture as 2×2 tiles and the global one, 16 image tokens each.
IMAGE_TOKENS = 80


def picture(seed: int = 0, size: tuple[int, int] = (200, 150)) -> Image.Image:
    """A drawn scene: a red square and a blue disc, moved by `seed`."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((10 + seed, 10, 90 + seed, 80), fill="red")
    draw.ellipse((100, 40 + seed, 180, 120 + seed), fill="blue")
    return image


def encoded(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


def image_server(server_factory: ServerFactory, **extra: str) -> Server:
    """The vision model's server, pinned: test_images and test_image_errors share it."""
    settings = {"model": "tiny-vl", "max_image_pixels": str(MAX_PIXELS), "max_images": str(MAX_IMAGES), **extra}
    return server_factory(**settings, pinned=True)
