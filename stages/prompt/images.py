"""An image part's bytes made a checked picture: fetched where allowed, size-capped, decoded by Pillow.

Every refusal is a 400 naming the client's part (`ImagePart.param`), before
any model work: undecodable bytes, a format other than PNG, JPEG, WebP or
GIF, a file over `max_image_bytes`, a picture over `max_image_pixels` (read
from its header, before a pixel is decoded: a pixel bomb costs nothing), a
remote URL whose host is not allowed or whose address is loopback,
link-local or private. Runs in the preparation threads, never on the loop.
"""

from __future__ import annotations

import hashlib
import io
import ipaddress
import socket
import urllib.parse
import urllib.request
import warnings
from typing import Any

import attrs

from pipeline.errors import RequestError, invalid, quote
from pipeline.requests import ImagePart
from pipeline.settings import Settings

# Pillow's format names of the media types the APIs accept.
FORMATS = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@attrs.frozen(kw_only=True)
class ImageLimits:
    max_bytes: int
    max_pixels: int
    # Hosts whose URLs are fetched; "*" any public one; empty: no remote URL.
    url_hosts: frozenset[str] = frozenset()
    url_timeout: float = 10.0

    @classmethod
    def of(cls, settings: Settings) -> ImageLimits:
        hosts = frozenset(h.strip().lower() for h in (settings.image_url_hosts or "").split(",") if h.strip())
        return cls(
            max_bytes=settings.max_image_bytes,
            max_pixels=settings.max_image_pixels,
            url_hosts=hosts,
            url_timeout=settings.image_url_timeout,
        )


@attrs.frozen
class Picture:
    """A decoded image in RGB and the hash of its pixels (the same picture sent twice, any way: one digest)."""

    image: Any
    digest: bytes


def decode(part: ImagePart, limits: ImageLimits) -> Picture:
    """The part's picture, checked.

    Raises:
        RequestError: a 400 naming the part.
    """
    from PIL import Image, UnidentifiedImageError

    data = part.data if part.data is not None else fetch(part, limits)
    if len(data) > limits.max_bytes:
        raise _bad(part, f"is {len(data)} bytes, over this server's limit of {limits.max_bytes}", "image_too_large")
    try:
        with warnings.catch_warnings():
            # Pillow warns between its bomb limit and twice it; the check below decides instead.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=list(FORMATS))
        width, height = image.size
        if width * height > limits.max_pixels:
            limit = limits.max_pixels
            raise _bad(part, f"is {width}×{height} pixels, over this server's limit of {limit}", "image_too_large")
        media_type = FORMATS[str(image.format)]
        if part.media_type is not None and part.media_type != media_type:
            raise _bad(part, f"is declared {quote(part.media_type)} but its bytes are {media_type}", "invalid_image")
        image.seek(0)
        rgb = image.convert("RGB")
    except RequestError:
        raise
    except UnidentifiedImageError:
        raise _bad(part, "is not a PNG, JPEG, WebP or GIF image", "invalid_image") from None
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError):
        raise _bad(part, "could not be decoded", "invalid_image") from None
    digest = hashlib.sha256(f"{rgb.width}x{rgb.height}:".encode() + rgb.tobytes()).digest()
    return Picture(image=rgb, digest=digest)


def fetch(part: ImagePart, limits: ImageLimits) -> bytes:
    """The bytes of an http(s) image URL on an allowed public host, at most `max_bytes` of them."""
    url = part.url or ""
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if not limits.url_hosts:
        raise _bad(part, "is a remote URL; this server takes images as data: URLs or base64 only", "image_url_refused")
    if "*" not in limits.url_hosts and host not in limits.url_hosts:
        raise _bad(part, f"names host {quote(host)}, which this server does not fetch from", "image_url_refused")
    _check_public(part, host)
    request = urllib.request.Request(url, headers={"User-Agent": "mlx-relay"})
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=limits.url_timeout) as response:
            data: bytes = response.read(limits.max_bytes + 1)
    except OSError as error:
        raise _bad(part, f"could not be fetched ({type(error).__name__})", "image_url_failed") from None
    return data


def _check_public(part: ImagePart, host: str) -> None:
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        raise _bad(part, f"names host {quote(host)}, which does not resolve", "image_url_failed") from None
    for address in addresses:
        ip = ipaddress.ip_address(str(address).split("%")[0])
        if not ip.is_global or ip.is_multicast:
            raise _bad(part, f"resolves to {ip}, a non-public address this server never fetches", "image_url_refused")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect could lead to a private address after the check: not followed.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _bad(part: ImagePart, what: str, code: str) -> RequestError:
    return invalid(f"The image at '{part.param}' {what}", param=part.param, code=code)
