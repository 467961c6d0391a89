"""Length-prefixed msgpack frames over a byte stream (a Unix socket between the front and a worker).

A frame is a 4-byte big-endian length and that many bytes of one message.
Reading and writing are awaited, so a reader that stops reading holds the
writer back once the socket's buffer is full: the crossing is bounded in
both directions by the kernel's buffer and the channels on either side.
Both sides make their encoders and decoders here (`encoder`, `decoder`):
a path (a model's or an adapter's folder, in `StartIn`) crosses as text.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import anyio
import msgspec
from anyio.abc import ByteStream

T = TypeVar("T")

_HEADER = struct.Struct(">I")
# One step's frame for a full batch is a few kilobytes; a job's embeddings can be more.
MAX_FRAME = 64 * 1024 * 1024


def _encode_path(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise NotImplementedError(f"{type(value).__name__} does not cross")


def _decode_path(kind: type, value: Any) -> Any:
    if kind is Path:
        return Path(value)
    raise NotImplementedError(f"{kind.__name__} does not cross")


def encoder() -> msgspec.msgpack.Encoder:
    """An encoder for the crossing's messages; one per thread (its buffer is its own)."""
    return msgspec.msgpack.Encoder(enc_hook=_encode_path)


def decoder(kind: Any) -> msgspec.msgpack.Decoder[Any]:
    """A decoder of `kind`, a message or a union of them."""
    return msgspec.msgpack.Decoder(kind, dec_hook=_decode_path)


def encode_frame(encoder: msgspec.msgpack.Encoder, message: object, buffer: bytearray | None = None) -> bytes:
    """One frame: the 4-byte length and the message; a caller's `buffer` is reused rather than grown anew.

    The one writer of the framing, for the front's `FrameWriter` and the worker's
    `workers/frames_out.py` alike, so `FrameReader` on either side reads what both write.
    """
    out = bytearray() if buffer is None else buffer
    out.clear()
    out.extend(b"\0\0\0\0")
    encoder.encode_into(message, out, _HEADER.size)
    _HEADER.pack_into(out, 0, len(out) - _HEADER.size)
    return bytes(out)


class FrameError(Exception):
    """The peer broke the framing (a frame past the bound, or a message that does not decode)."""


class FrameWriter:
    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._encoder = encoder()
        self._buffer = bytearray()

    async def send(self, message: object) -> None:
        await self._stream.send(encode_frame(self._encoder, message, self._buffer))


class FrameReader(Generic[T]):
    def __init__(self, stream: ByteStream, kind: Any) -> None:
        self._stream = stream
        self._decoder = decoder(kind)
        self._pending = bytearray()

    async def receive(self) -> T:
        """The next message.

        Raises:
            anyio.EndOfStream: the peer closed the stream between frames.
            FrameError: a frame past `MAX_FRAME`, a stream cut inside a frame, or a message that does not decode.
        """
        header = await self._exactly(_HEADER.size, first=True)
        (size,) = _HEADER.unpack(header)
        if size > MAX_FRAME:
            raise FrameError(f"a frame of {size} bytes is past the bound")
        body = await self._exactly(size, first=False)
        try:
            return cast(T, self._decoder.decode(body))
        except msgspec.DecodeError as error:
            raise FrameError(str(error)) from error

    async def _exactly(self, size: int, *, first: bool) -> bytes:
        while len(self._pending) < size:
            try:
                self._pending.extend(await self._stream.receive())
            except anyio.EndOfStream:
                if first and not self._pending:
                    raise
                raise FrameError("the stream ended inside a frame") from None
        chunk = bytes(self._pending[:size])
        del self._pending[:size]
        return chunk
