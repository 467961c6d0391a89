"""A client that leaves ends its request wherever the request is: waiting for admission, before its
first byte (parse, preparation, prefill), or decoding; streamed or not; over HTTP/1.1 (a closed
socket) and HTTP/2 (a reset stream). Its row leaves the batch, its admission ticket comes back,
and honest clients are served afterwards. Storms of such clients hold nothing either.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.conftest import Server, ServerFactory
from tests.e2e.raw_clients import H2Client, http1_send, wait_for

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Tell me something."}]
# Long enough that a request run to its end is unmistakable in the token count.
MAX_TOKENS = 2000
# How long the server may take to notice a client that left (the requests would run for many seconds).
NOTICE = 30.0


def long_body(stream: bool) -> dict[str, object]:
    return {"model": "m", "messages": HELLO, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}


def is_idle(figures: dict[str, object]) -> bool:
    admission, gateway = figures["admission"], figures["gateway"]
    assert isinstance(admission, dict) and isinstance(gateway, dict)
    return (
        admission["in_flight"] == 0 and gateway["active"] == 0 and gateway["pending"] == 0 and figures["sink_rows"] == 0
    )


def generated(figures: dict[str, object]) -> int:
    gateway = figures["gateway"]
    assert isinstance(gateway, dict)
    return int(gateway["generated_tokens"])


def refused(figures: dict[str, object]) -> int:
    admission = figures["admission"]
    assert isinstance(admission, dict)
    return int(admission["refused"])


def decoding_since(before: dict[str, object]) -> Callable[[dict[str, object]], bool]:
    return lambda figures: generated(figures) > generated(before)


class Leaver:
    """One request sent over HTTP/1.1 or h2 and then abandoned: the socket closed, or the stream reset."""

    def __init__(self, server: Server, protocol: str, stream: bool) -> None:
        self.h2 = H2Client(server) if protocol == "h2" else None
        self.sock: socket.socket | None = None
        if self.h2 is not None:
            self.stream_id = self.h2.post(CHAT, long_body(stream))
        else:
            self.sock = http1_send(server, CHAT, long_body(stream))

    def leave(self) -> None:
        if self.h2 is not None:
            # Only the stream goes: the connection stays open, so the reset alone must end the request.
            self.h2.reset(self.stream_id)
        elif self.sock is not None:
            self.sock.close()

    def still_serves(self) -> None:
        """The h2 connection that reset a stream still answers a request on another."""
        if self.h2 is None:
            return
        h2 = self.h2
        stream_id = h2.post(CHAT, {"model": "m", "messages": HELLO, "max_tokens": 3})
        h2.read_until(lambda: stream_id in h2.ended)
        assert h2.status[stream_id] == 200, h2.data.get(stream_id)

    def close(self) -> None:
        if self.h2 is not None:
            self.h2.close()
        elif self.sock is not None:
            self.sock.close()


def assert_served(client: openai.OpenAI) -> None:
    # Past the random model's end of turn: whether it picks it within 5 tokens is a near-tie that a batch of 8
    # rows on another BLAS kernel can tip (seen once in a clean-clone run), not what is asserted here.
    completion = client.chat.completions.create(
        model="m", messages=HELLO, max_tokens=5, extra_body={"ignore_eos": True}
    )
    assert completion.usage is not None and completion.usage.completion_tokens == 5


@pytest.mark.parametrize("protocol", ["http1", "h2"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("point", ["before_first_byte", "decoding"])
def test_a_client_that_leaves_ends_its_request(
    server: Server, client: openai.OpenAI, protocol: str, stream: bool, point: str
) -> None:
    before = wait_for(server, is_idle, timeout=NOTICE, what="the server was not idle before the test")
    leaver = Leaver(server, protocol, stream)
    try:
        if point == "decoding":
            wait_for(server, decoding_since(before), timeout=NOTICE, what="the request did not start decoding")
        leaver.leave()
        after = wait_for(server, is_idle, timeout=NOTICE, what="the abandoned request still holds the server")
        assert generated(after) - generated(before) < MAX_TOKENS // 2
        assert refused(after) == refused(before)
        leaver.still_serves()
    finally:
        leaver.close()
    assert_served(client)


@pytest.fixture(scope="module")
def one_slot(server_factory: ServerFactory) -> Server:
    """A server that admits one request at a time, and lets others wait long for their turn."""
    return server_factory(max_batch="1", max_pending="0", admission_timeout="60")


@pytest.mark.parametrize("protocol", ["http1", "h2"])
@pytest.mark.parametrize("wait", [0.0, 0.5], ids=["at_once", "while_waiting"])
def test_a_client_that_leaves_while_queued_for_admission_is_never_run(
    one_slot: Server, protocol: str, wait: float
) -> None:
    before = wait_for(one_slot, is_idle, timeout=NOTICE, what="the server was not idle before the test")
    holder = http1_send(one_slot, CHAT, long_body(True))
    try:
        wait_for(one_slot, decoding_since(before), timeout=NOTICE, what="the holder did not start")
        queued = Leaver(one_slot, protocol, stream=False)
        # Time to reach the admission wait (or none: the client leaves with its last byte).
        time.sleep(wait)
        queued.leave()
    finally:
        holder.close()
    try:
        # From here on the holder has at most a step or two left; the queued request, if run, has all its tokens.
        released = generated(wait_for(one_slot, lambda _: True, timeout=NOTICE, what="no /stats"))
        after = wait_for(
            one_slot, is_idle, timeout=NOTICE, what="the queued request was admitted after its client left"
        )
        assert generated(after) - released < MAX_TOKENS // 2, "the abandoned request ran once the slot was free"
        queued.still_serves()
    finally:
        queued.close()
    assert_served(one_slot.client())


def test_two_hundred_connections_abandoned_before_their_first_byte_hold_nothing(
    server: Server, client: openai.OpenAI
) -> None:
    before = wait_for(server, is_idle, timeout=NOTICE, what="the server was not idle before the test")
    for _ in range(200):
        http1_send(server, CHAT, long_body(True)).close()
    after = wait_for(server, is_idle, timeout=NOTICE, what="the abandoned requests still hold the server")
    # Run to the end they would be 200 x MAX_TOKENS; a few tokens each before the abort lands is fine.
    assert generated(after) - generated(before) < 200 * MAX_TOKENS // 20
    assert refused(after) == refused(before)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda _: assert_served(client), range(8)))


def test_an_h2_reset_storm_holds_nothing(server: Server, client: openai.OpenAI) -> None:
    before = wait_for(server, is_idle, timeout=NOTICE, what="the server was not idle before the test")
    h2 = H2Client(server)
    try:
        # HEADERS + DATA + RST_STREAM, 500 times, sent together on one connection.
        for _ in range(500):
            h2.post(CHAT, long_body(False), reset=True, flush=False)
        h2.flush()
        after = wait_for(server, is_idle, timeout=NOTICE, what="the reset streams still hold the server")
        assert generated(after) - generated(before) < 500 * MAX_TOKENS // 20
        assert refused(after) == refused(before)
        stream_id = h2.post(CHAT, {"model": "m", "messages": HELLO, "max_tokens": 3})
        h2.read_until(lambda: stream_id in h2.ended)
        assert h2.status[stream_id] == 200
    finally:
        h2.close()
    assert_served(client)
