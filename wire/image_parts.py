"""Image parts of every API → `ImagePart`: a `data:` URL or base64 read into bytes, an http(s) URL kept.

Only the envelope is checked here (the scheme, the declared media type, the
base64); the picture itself is decoded on the prompt side
(`stages/prompt/images.py`), off the event loop, with its pixel and byte caps.
"""

from __future__ import annotations

import base64
import binascii

from pipeline.errors import invalid, quote
from pipeline.requests import ImageDetail, ImagePart

MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
_DETAILS = {detail.value: detail for detail in ImageDetail}


def image_from_url(url: str, *, param: str, offset: int, detail: str | None = None) -> ImagePart:
    """An image given by URL: a `data:` URL's bytes, or an http(s) URL the prompt side may fetch."""
    chosen = _detail(detail, param)
    if url.startswith("data:"):
        header, comma, payload = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if not comma or encoding != "base64":
            raise invalid(f"'{param}' must be a base64 data URL (data:image/png;base64,...)", param=param)
        return image_from_base64(payload, media_type.lower(), param=param, offset=offset, detail=chosen)
    if url.startswith(("http://", "https://")):
        return ImagePart(param=param, offset=offset, url=url, detail=chosen)
    raise invalid(f"'{param}' must be a data: URL or an http(s) URL, got {quote(url[:40])}", param=param)


def image_from_base64(
    data: str, media_type: str | None, *, param: str, offset: int, detail: ImageDetail = ImageDetail.AUTO
) -> ImagePart:
    """An image sent inline as base64; `media_type` as the client declared it."""
    if media_type is not None and media_type not in MEDIA_TYPES:
        raise invalid(
            f"'{param}' has media type {quote(media_type)}; supported are {', '.join(MEDIA_TYPES)}",
            param=param,
            code="unsupported_media_type",
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise invalid(f"'{param}' is not valid base64", param=param, code="invalid_image") from None
    if not raw:
        raise invalid(f"'{param}' holds no image data", param=param, code="invalid_image")
    return ImagePart(param=param, offset=offset, data=raw, media_type=media_type, detail=detail)


def _detail(value: str | None, param: str) -> ImageDetail:
    if value is None:
        return ImageDetail.AUTO
    chosen = _DETAILS.get(value)
    if chosen is None:
        raise invalid(f"'{param}' detail must be one of {sorted(_DETAILS)}, got {quote(value)}", param=param)
    return chosen
