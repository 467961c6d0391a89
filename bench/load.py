"""The load driver: N concurrent streaming clients against one OpenAI server.

Each client sends its requests one after another to `/v1/completions` with
`stream: true`; all N clients start together, and a wave's wall time runs
from the first send to the last stream's end. Only httpx and the stdlib
here: the client side must stay cheap, since it shares the CPUs with the
server it measures.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Sequence

import attrs
import httpx

from bench.workload import Workload, prompt

# Generous: a wave on a slow machine may queue requests for a long time, and
# a timeout would hide the server's real behaviour behind a client error.
_TIMEOUT = httpx.Timeout(600.0, connect=10.0)
# The OpenAI SDK's default max_retries.
RETRIES = 2


@attrs.frozen(kw_only=True)
class RequestResult:
    prompt: str
    ttft: float | None  # seconds from send to the first non-empty text chunk
    decode_tps: float | None  # tokens after the first, over first-to-last text chunk
    completion_tokens: int
    counted_by: str  # "usage" (the server's count) or "chunks" (a lower bound)
    finish_reason: str | None
    text: str
    retries: int = 0  # reconnects after a transport error before any response
    error: str | None = None


@attrs.define
class _Stream:
    """What one SSE stream has shown so far."""

    prompt: str
    start: float
    first: float | None = None
    last: float | None = None
    chunks: int = 0
    parts: list[str] = attrs.Factory(list)
    usage_tokens: int | None = None
    finish_reason: str | None = None
    done: bool = False
    responded: bool = False
    retries: int = 0
    error: str | None = None

    def on_data(self, payload: str) -> None:
        if payload == "[DONE]":
            self.done = True
            return
        chunk = json.loads(payload)
        if "error" in chunk:
            self.error = f"error frame: {chunk['error']}"
        if chunk.get("usage"):
            self.usage_tokens = int(chunk["usage"]["completion_tokens"])
        for choice in chunk.get("choices") or ():
            self._on_choice(choice)

    def _on_choice(self, choice: dict[str, object]) -> None:
        text = choice.get("text")
        if isinstance(text, str) and text:
            now = time.perf_counter()
            self.first = self.first if self.first is not None else now
            self.last = now
            self.chunks += 1
            self.parts.append(text)
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])

    def result(self, error: str | None = None) -> RequestResult:
        error = error or self.error or (None if self.done else "stream ended without [DONE]")
        # Both servers send `usage` when asked (stream_options.include_usage).
        # Without it, non-empty text chunks are only a lower bound: a server may
        # hold back a token's text (partial UTF-8, a possible stop string) and
        # send it with the next one. The report marks such counts.
        tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        return RequestResult(
            prompt=self.prompt,
            ttft=None if self.first is None else self.first - self.start,
            decode_tps=_decode_tps(tokens, self.first, self.last),
            completion_tokens=tokens,
            counted_by="usage" if self.usage_tokens is not None else "chunks",
            finish_reason=self.finish_reason,
            text="".join(self.parts),
            retries=self.retries,
            error=error,
        )


def _decode_tps(tokens: int, first: float | None, last: float | None) -> float | None:
    # The first token's time is TTFT (prefill), so decode speed counts the rest.
    if first is None or last is None or last <= first or tokens < 2:
        return None
    return (tokens - 1) / (last - first)


async def stream_completion(
    client: httpx.AsyncClient, url: str, text: str, max_tokens: int, temperature: float = 0.0
) -> RequestResult:
    """One streaming completion (greedy unless `temperature` says otherwise); failures become results, not
    exceptions.

    A connection that fails before any response is retried at once, up to
    `RETRIES` times, as the OpenAI SDK retries by default; the clock keeps
    running from the first send, so a retry costs its request TTFT. (Seen
    with mlx_lm.server: its ThreadingHTTPServer listens with a backlog of 5,
    and 16 simultaneous connects get some resets and ~1 s SYN retransmits.)
    """
    body = {
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stream = _Stream(prompt=text, start=time.perf_counter())
    while True:
        try:
            return await _read(client, f"{url}/v1/completions", body, stream)
        except httpx.TransportError as error:
            if stream.responded or stream.retries == RETRIES:
                return stream.result(_describe(error))
            stream.retries += 1
        except (httpx.HTTPError, json.JSONDecodeError) as error:
            return stream.result(_describe(error))


async def _read(client: httpx.AsyncClient, url: str, body: dict[str, object], stream: _Stream) -> RequestResult:
    async with client.stream("POST", url, json=body) as response:
        stream.responded = True
        if response.status_code != 200:
            await response.aread()
            return stream.result(f"HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                stream.on_data(line[5:].strip())
    return stream.result()


def _describe(error: Exception) -> str:
    # httpx's transport errors often have an empty message; the cause says more.
    detail = str(error) or repr(error.__context__)
    return f"{type(error).__name__}: {detail}"


@attrs.frozen(kw_only=True)
class Wave:
    level: int
    wall: float
    requests: tuple[RequestResult, ...]
    # CPU seconds this client process spent on the wave: what reading the streams costs the machine.
    client_cpu: float = 0.0


async def run_wave(url: str, level: int, workload: Workload, *, wave: int = 0) -> Wave:
    """`level` clients, each sending `requests_per_client` requests in turn; each wave its own prompts."""
    limits = httpx.Limits(max_connections=level, max_keepalive_connections=level)
    first = wave * workload.requests_per_client
    async with httpx.AsyncClient(timeout=_TIMEOUT, limits=limits) as client:
        start, cpu_start = time.perf_counter(), time.process_time()
        per_client = await asyncio.gather(*(_client(client, url, level, c, first, workload) for c in range(level)))
        wall, client_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    requests = tuple(r for results in per_client for r in results)
    return Wave(level=level, wall=wall, requests=requests, client_cpu=client_cpu)


async def _client(
    client: httpx.AsyncClient, url: str, level: int, index: int, first: int, workload: Workload
) -> list[RequestResult]:
    results = []
    for request in range(first, first + workload.requests_per_client):
        text = prompt(level, index, request)
        results.append(await stream_completion(client, url, text, workload.max_tokens, workload.temperature))
    return results


async def warm_up(url: str, text: str, max_tokens: int) -> RequestResult:
    async with httpx.AsyncClient(timeout=_TIMEOUT) as client:
        return await stream_completion(client, url, text, max_tokens)


def summarize(wave: Wave, max_tokens: int) -> dict[str, object]:
    """The numbers the report shows for one server at one concurrency level."""
    ok = [r for r in wave.requests if r.error is None]
    tokens = sum(r.completion_tokens for r in ok)
    ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
    decode = [r.decode_tps for r in ok if r.decode_tps is not None]
    return {
        "concurrency": wave.level,
        "requests": len(wave.requests),
        "errors": [r.error for r in wave.requests if r.error is not None],
        # Requests that stopped before max_tokens: the demo model never emits
        # EOS, so any here is a wrong count or an early stop worth a look.
        "short": sum(1 for r in ok if r.completion_tokens != max_tokens),
        "retries": sum(r.retries for r in wave.requests),
        "counted_by": sorted({r.counted_by for r in ok}),
        "completion_tokens": tokens,
        "wall_s": wave.wall,
        "tokens_per_s": tokens / wave.wall if wave.wall > 0 else 0.0,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p95_ms": percentile(ttfts, 95),
        "request_decode_tps": sum(decode) / len(decode) if decode else None,
        "client_cpu_s_per_1k_tokens": wave.client_cpu / tokens * 1000 if tokens else None,
    }


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def chunk_arrivals(url: str, model: str, index: int, max_tokens: int, sampling: dict[str, object]) -> list[float]:
    """When each content chunk of one streamed chat arrived (`perf_counter`), for gap figures beside other load."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Tell me about {index}."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **sampling,
        "stream": True,
    }
    arrivals: list[float] = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                arrivals.append(time.perf_counter())
    return arrivals
