"""Images through every API on `tiny-vl` (a random-weight SmolVLM), with the real openai and anthropic SDKs.

One server per mode (a model worker, the default; and `--in-process`),
started once. Outputs are greedy and compared within one server, never
against recorded tokens.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from tests.conftest import Server, ServerFactory
from tests.e2e.conftest import stats
from tests.e2e.images import IMAGE_TOKENS, b64, data_url, encoded, image_server, picture

pytestmark = pytest.mark.slow

QUESTION = "What is in this picture?"


@pytest.fixture(scope="module", params=["worker", "in-process"])
def vl(request: pytest.FixtureRequest, server_factory: ServerFactory) -> Server:
    return image_server(server_factory, **({"in_process": "1"} if request.param == "in-process" else {}))


def chat_parts(url: str, text: str = QUESTION) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}]


def encoder(server: Server) -> dict[str, int]:
    gateway = stats(server)["gateway"]
    assert isinstance(gateway, dict)
    value = gateway["encoder_cache"]
    assert isinstance(value, dict)
    return value


def test_chat_counts_the_image_tokens_streaming_and_not(vl: Server) -> None:
    client = vl.client()
    url = data_url(encoded(picture(1)))
    text_only = client.chat.completions.create(
        model="m", max_tokens=4, temperature=0, messages=[{"role": "user", "content": QUESTION}]
    )
    with_image = client.chat.completions.create(
        model="m", max_tokens=4, temperature=0, messages=[{"role": "user", "content": chat_parts(url)}]
    )
    assert with_image.usage is not None and text_only.usage is not None
    assert with_image.usage.prompt_tokens - text_only.usage.prompt_tokens >= IMAGE_TOKENS
    chunks = list(
        client.chat.completions.create(
            model="m",
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            messages=[{"role": "user", "content": chat_parts(url)}],
        )
    )
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == with_image.usage.prompt_tokens
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == with_image.choices[0].message.content


def test_responses_input_image_streaming_and_not(vl: Server) -> None:
    client = vl.client()
    item = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": QUESTION},
                {"type": "input_image", "image_url": data_url(encoded(picture(2))), "detail": "high"},
            ],
        }
    ]
    plain = client.responses.create(model="m", max_output_tokens=4, temperature=0, input=QUESTION, store=False)
    answer = client.responses.create(model="m", max_output_tokens=4, temperature=0, input=item, store=False)
    # Four tokens end it at max_output_tokens: "incomplete", as OpenAI answers.
    assert answer.status == "incomplete" and answer.usage is not None and plain.usage is not None
    assert answer.usage.input_tokens - plain.usage.input_tokens >= IMAGE_TOKENS
    events = list(
        client.responses.create(model="m", max_output_tokens=4, temperature=0, input=item, stream=True, store=False)
    )
    done = events[-1]
    assert done.type == "response.incomplete"
    assert done.response.usage is not None and done.response.usage.input_tokens == answer.usage.input_tokens


@pytest.mark.parametrize("source", ["base64", "url"])
def test_messages_image_block_and_count_tokens(vl: Server, source: str) -> None:
    claude = vl.anthropic_client()
    png = encoded(picture(3))
    block: dict[str, Any] = (
        {"type": "base64", "media_type": "image/png", "data": b64(png)}
        if source == "base64"
        else {"type": "url", "url": data_url(png)}
    )
    messages: Any = [
        {"role": "user", "content": [{"type": "image", "source": block}, {"type": "text", "text": QUESTION}]}
    ]
    counted = claude.messages.count_tokens(model="m", messages=messages)
    text_only = claude.messages.count_tokens(model="m", messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens - text_only.input_tokens >= IMAGE_TOKENS
    reply = claude.messages.create(model="m", max_tokens=4, messages=messages)
    assert reply.usage.input_tokens + (reply.usage.cache_read_input_tokens or 0) == counted.input_tokens
    with claude.messages.stream(model="m", max_tokens=4, messages=messages) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == counted.input_tokens


def _ttft(server: Server, messages: Any) -> float:
    began = time.perf_counter()
    stream = server.client().chat.completions.create(
        model="m", max_tokens=1, temperature=0, stream=True, messages=messages
    )
    # The first chunk (the role) leaves at admission; the first token's after the prefill.
    for chunk in stream:
        if chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
            break
    elapsed = time.perf_counter() - began
    stream.close()
    return elapsed


def test_the_same_picture_twice_hits_the_encoder_cache(vl: Server) -> None:
    png = encoded(picture(4))
    before = encoder(vl)
    # Different words before the picture: the prompt cache cannot cover the image, the encoder cache can.
    first = _ttft(vl, [{"role": "user", "content": chat_parts(data_url(png), "First: look.")}])
    after_first = encoder(vl)
    # The same pixels as base64 in another API's shape: the same digest.
    claude = vl.anthropic_client()
    began = time.perf_counter()
    claude.messages.create(
        model="m",
        max_tokens=1,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Second: look again."},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png)}},
                ],
            }
        ],
    )
    second = time.perf_counter() - began
    after_second = encoder(vl)
    print(f"first prefill (encode) {first * 1000:.1f} ms, second (encoder cache hit) {second * 1000:.1f} ms")
    assert after_first["encoded_images"] == before["encoded_images"] + 1
    assert after_second["hits"] == after_first["hits"] + 1
    assert after_second["encoded_images"] == after_first["encoded_images"]
    assert after_second["encode_seconds"] == after_first["encode_seconds"]


def test_an_image_conversation_reuses_its_prefix_over_three_turns(vl: Server) -> None:
    client = vl.client()
    url = data_url(encoded(picture(5)))
    messages: list[Any] = [{"role": "user", "content": chat_parts(url, "Conversation five. Describe:")}]
    previous_prompt, encoded_before = 0, encoder(vl)["encoded_images"]
    for turn in range(3):
        answer = client.chat.completions.create(model="m", max_tokens=6, temperature=0, messages=messages)
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
        cached = answer.usage.prompt_tokens_details.cached_tokens or 0
        if turn:
            # Turn n's prompt is turn n-1's, then its answer and a new question: all of the old prompt is reused.
            assert cached >= previous_prompt, (turn, cached, previous_prompt)
        previous_prompt = answer.usage.prompt_tokens
        messages += [
            {"role": "assistant", "content": answer.choices[0].message.content},
            {"role": "user", "content": f"And now, turn {turn + 2}?"},
        ]
    # Encoded once, on the first turn.
    assert encoder(vl)["encoded_images"] == encoded_before + 1


def test_a_text_row_beside_an_image_row_decodes_unchanged(vl: Server) -> None:
    client = vl.client()
    text_messages: Any = [{"role": "user", "content": "Write about rivers and the sea, at length."}]
    alone = client.chat.completions.create(model="m", max_tokens=24, temperature=0, messages=text_messages)
    results: dict[str, Any] = {}

    def image_request(seed: int) -> None:
        results[f"image{seed}"] = vl.client().chat.completions.create(
            model="m",
            max_tokens=24,
            temperature=0,
            messages=[{"role": "user", "content": chat_parts(data_url(encoded(picture(seed))), f"Image {seed}:")}],
        )

    threads = [threading.Thread(target=image_request, args=(seed,)) for seed in (6, 7)]
    for thread in threads:
        thread.start()
    beside = vl.client().chat.completions.create(model="m", max_tokens=24, temperature=0, messages=text_messages)
    for thread in threads:
        thread.join(60)
    assert beside.choices[0].message.content == alone.choices[0].message.content
    assert all(results[f"image{seed}"].usage.prompt_tokens > IMAGE_TOKENS for seed in (6, 7))


def test_detail_low_reads_the_picture_as_one_tile(vl: Server) -> None:
    client = vl.client()
    url = data_url(encoded(picture(8)))
    usage = {}
    for detail in ("high", "low"):
        part = {"type": "image_url", "image_url": {"url": url, "detail": detail}}
        answer = client.chat.completions.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": [{"type": "text", "text": "See:"}, part]}]
        )
        assert answer.usage is not None
        usage[detail] = answer.usage.prompt_tokens
    # Four tiles and the global image against the global image alone: 64 image tokens fewer, and the tiles' markers.
    assert usage["high"] - usage["low"] >= IMAGE_TOKENS * 4 // 5


def test_another_picture_at_the_same_place_reuses_no_image_kv(vl: Server) -> None:
    client = vl.client()

    def ask(seed: int) -> Any:
        content = chat_parts(data_url(encoded(picture(seed))), "Same words before either picture:")
        return client.chat.completions.create(
            model="m", max_tokens=2, temperature=0, messages=[{"role": "user", "content": content}]
        )

    first, other, again = ask(11), ask(12), ask(11)
    for answer in (first, other, again):
        assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
    # The prompts are token for token alike but for the picture: only the words before it may be reused.
    assert other.usage.prompt_tokens == first.usage.prompt_tokens
    assert (other.usage.prompt_tokens_details.cached_tokens or 0) < other.usage.prompt_tokens - IMAGE_TOKENS
    assert (again.usage.prompt_tokens_details.cached_tokens or 0) >= again.usage.prompt_tokens - 2
