"""Speculative decoding end to end, through hypercorn and the openai SDK, on the tiny demo model.

The same requests go to a server without speculation, one with prompt
lookup (through the model worker process, and in-process) and one with the
model as its own draft: greedy, seeded, constrained, stop-string and
logprobs replies must be identical, alone and several at once in the
batch. /stats and /metrics must show proposals were made and accepted,
so a server that never speculated cannot pass. Combinations that cannot
run are refused at start, naming them.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests import loopback
from tests.conftest import Server, ServerFactory, start_server
from tests.e2e.conftest import stats
from wire.metric_figures import SPEC_DECODE_PATHS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

# Copy-heavy: the answer tends to repeat the prompt, and a random model's greedy output falls into loops.
COPY = " ".join(["alpha beta gamma delta epsilon zeta eta theta"] * 6)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "count": {"type": "integer"}},
    "required": ["name", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def servers(server_factory: ServerFactory) -> dict[str, Server]:
    return {
        "plain": server_factory(prompt_lookup="0"),
        # Prompt lookup by default: the measured gate decides; asked for (`1`), as here, it is refused where it
        # cannot run.
        "lookup": server_factory(prompt_lookup="1"),
        "lookup_in_process": server_factory(prompt_lookup="1", in_process="1"),
        "draft": server_factory(draft_model="tiny"),
    }


def _complete(server: Server, **extra: Any) -> Any:
    with server.client() as client:
        body: dict[str, Any] = {"model": "tiny", "prompt": COPY, "max_tokens": 40, "temperature": 0, **extra}
        return client.completions.create(**body)


def _chat(server: Server, **extra: Any) -> Any:
    with server.client() as client:
        messages = [{"role": "user", "content": f"Repeat this exactly: {COPY}"}]
        body: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": 40, "temperature": 0, **extra}
        return client.chat.completions.create(**body)


CASES: dict[str, Any] = {
    "greedy": lambda s: _complete(s).choices[0].text,
    "seeded": lambda s: _complete(s, temperature=0.4, seed=7).choices[0].text,
    "penalties": lambda s: (
        _complete(s, temperature=0.7, seed=3, presence_penalty=0.8, frequency_penalty=0.4).choices[0].text
    ),
    "stop": lambda s: (lambda c: (c.text, c.finish_reason))(_complete(s, stop=["eta", "ta"], max_tokens=60).choices[0]),
    "logprobs": lambda s: [
        (item.token, round(item.logprob, 3), [(top.token, round(top.logprob, 3)) for top in item.top_logprobs])
        for item in _chat(s, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    ],
    "constrained": lambda s: (
        _chat(
            s,
            response_format={"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA, "strict": True}},
        )
        .choices[0]
        .message.content
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_reply_is_the_same_with_either_drafter(servers: dict[str, Server], case: str) -> None:
    replies = {name: CASES[case](server) for name, server in servers.items()}
    assert replies["lookup"] == replies["plain"]
    assert replies["lookup_in_process"] == replies["plain"]
    assert replies["draft"] == replies["plain"]
    if case == "constrained":
        # The grammar held (max_tokens may cut it short of its end).
        assert replies["plain"].startswith('{"name"')


def test_rows_verified_together_keep_their_replies(servers: dict[str, Server]) -> None:
    """Several rows at once: the speculating server verifies them in one pass per step."""
    requests = [
        lambda s, i=i: (
            _complete(s, prompt=COPY[i * 7 :], max_tokens=30 + i, temperature=0.3 * (i % 2), seed=i).choices[0].text
        )
        for i in range(4)
    ]

    def run(server: Server) -> list[str]:
        with ThreadPoolExecutor(len(requests)) as pool:
            return list(pool.map(lambda request: request(server), requests))

    expected = run(servers["plain"])
    assert run(servers["lookup"]) == expected
    assert run(servers["draft"]) == expected


def test_stats_and_metrics_count_proposed_and_accepted_tokens(servers: dict[str, Server]) -> None:
    _complete(servers["draft"])
    _complete(servers["lookup"])
    for name, drafter in (("draft", "draft_model"), ("lookup", "prompt_lookup")):
        figures: Any = stats(servers[name])["gateway"]
        speculation = figures["speculation"]
        assert speculation["drafter"] == drafter
        assert speculation["proposed_tokens"] >= speculation["accepted_tokens"] > 0
        # Tokens a row emits per verifying pass: its pending token and what it accepted.
        per_pass = (speculation["drafts"] + speculation["accepted_tokens"]) / speculation["drafts"]
        assert speculation["tokens_per_pass"] == pytest.approx(per_pass) and per_pass > 1
        assert figures["speculation_off"] is None
        metrics = loopback.get(f"{servers[name].base_url}/metrics", timeout=10).text
        accepted = next(
            line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_accepted_tokens_total")
        )
        assert float(accepted.split()[-1]) == speculation["accepted_tokens"]
        assert "vllm:spec_decode_num_draft_tokens_total" in metrics
        # Each path the metrics read by name is a number here (a renamed field would read as 0).
        assert all(isinstance(_at(figures, path[1:]), int) for path in SPEC_DECODE_PATHS)
        assert "mlx_relay:gateway_speculation_accepted_tokens_total" in metrics
        assert "mlx_relay:gateway_speculation_tokens_per_pass" in metrics
    plain: Any = stats(servers["plain"])["gateway"]
    # Turned off by the settings: nothing to say why.
    assert plain["speculation"] is None and plain["speculation_off"] is None
    assert "vllm:spec_decode" not in loopback.get(f"{servers['plain'].base_url}/metrics", timeout=10).text


def _at(snapshot: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        snapshot = snapshot.get(key) if isinstance(snapshot, dict) else None
    return snapshot


def test_the_finish_line_carries_the_rows_acceptance(servers: dict[str, Server]) -> None:
    _complete(servers["draft"])
    finishes = [json.loads(line) for line in servers["draft"].logs().splitlines() if '"request.finish"' in line]
    assert any(line.get("proposed_tokens", 0) >= line.get("accepted_tokens", -1) > 0 for line in finishes)


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"prompt_lookup": "1", "draft_model": "tiny"}, "choose one drafter"),
        # In the HTTP process, so the refusal's words reach the server's own log (a worker's do not yet).
        ({"draft_model": "smollm2", "in_process": "1"}, "MLX_RELAY_DRAFT_MODEL=smollm2: its tokenizer differs"),
    ],
)
def test_what_cannot_speculate_is_refused_at_start(tmp_path: Any, settings: dict[str, str], named: str) -> None:
    with pytest.raises(RuntimeError, match=named):
        start_server(tmp_path, **settings).kill()
