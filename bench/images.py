"""Image requests on a vision-language model: their rate, the encode's cost, and text streams' gaps meanwhile.

    python -m bench.images [--model tiny-vl] [--streams 4] [--images 8] [--rounds 3]

One server (a model worker, as served by default). Three figures:
- image requests per second: `--images` chats with a distinct picture each
  (no encoder-cache or prompt-cache hit), 8 at a time, one token each;
- the vision tower's time per image, from `/stats` (`gateway.encoder_cache`);
- the p95 gap between a text stream's chunks, `--streams` greedy streams
  alone and then while image requests arrive one after another (target: at
  most +20%); rounds alternate so drift weighs on both sides.
Writes bench/out/images.json. Pictures are drawn with Pillow.
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, ImageDraw

from bench.load import chunk_arrivals, percentile
from bench.servers import free_port, relay_command, started

OUT = Path(__file__).resolve().parent / "out"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.images", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="tiny-vl", help="a vision-language model (built-in name, directory, repo id)"
    )
    parser.add_argument("--streams", type=int, default=4, help="concurrent text streams")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per text stream")
    parser.add_argument("--images", type=int, default=8, help="image requests per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each alone then with images arriving")
    parser.add_argument("--out", type=Path, default=OUT)
    return parser


def picture_url(seed: int) -> str:
    image = Image.new("RGB", (320, 240), (seed * 37 % 256, 200, 255 - seed * 11 % 256))
    draw = ImageDraw.Draw(image)
    draw.rectangle((seed % 100, 20, 100 + seed % 100, 120), fill="red")
    draw.ellipse((150, seed % 80, 300, 150 + seed % 80), fill="blue")
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def _image_request(url: str, model: str, seed: int) -> None:
    content = [
        {"type": "text", "text": f"Picture {seed}:"},
        {"type": "image_url", "image_url": {"url": picture_url(seed)}},
    ]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
    httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).raise_for_status()


def _encoder(url: str) -> dict[str, Any]:
    figures: dict[str, Any] = httpx.get(f"{url}/stats", timeout=30).json()["gateway"]["encoder_cache"]
    return figures


def _round(url: str, args: argparse.Namespace, seeds: range | None) -> list[float]:
    def images() -> None:
        time.sleep(0.3)
        for seed in seeds or ():
            _image_request(url, args.model, seed)

    thread = threading.Thread(target=images)
    with ThreadPoolExecutor(args.streams) as pool:
        futures = [
            pool.submit(chunk_arrivals, url, args.model, i, args.max_tokens, {"temperature": 0})
            for i in range(args.streams)
        ]
        if seeds is not None:
            thread.start()
        streams = [future.result() for future in futures]
    if seeds is not None:
        thread.join()
    # The first gap is the prompt's prefill, not a decode step.
    return [later - earlier for arrivals in streams for earlier, later in itertools.pairwise(arrivals[1:])]


def _ms(gaps: list[float]) -> dict[str, float]:
    return {f"p{q}": round((percentile(gaps, q) or 0.0) * 1000, 2) for q in (50, 95, 99)} | {"n": len(gaps)}


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_RELAY_")} | {"MLX_RELAY_MODEL": args.model}
    with started("relay-images", relay_command(port), port, env, args.out / "logs") as server:
        _image_request(server.url, args.model, 10_000)  # warm-up: the tower's first shapes
        before = _encoder(server.url)
        began = time.perf_counter()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda seed: _image_request(server.url, args.model, seed), range(args.images)))
        rate = args.images / (time.perf_counter() - began)
        after = _encoder(server.url)
        encode_ms = (
            (after["encode_seconds"] - before["encode_seconds"])
            / max(1, after["encoded_images"] - before["encoded_images"])
            * 1000
        )
        alone: list[float] = []
        beside: list[float] = []
        for round_index in range(args.rounds):
            alone += _round(server.url, args, None)
            start = 1000 * (round_index + 1)
            beside += _round(server.url, args, range(start, start + args.images))
    result = {
        "model": args.model,
        "image_requests_per_s": round(rate, 2),
        "encode_ms_per_image": round(encode_ms, 2),
        "gaps_alone_ms": _ms(alone),
        "gaps_with_images_ms": _ms(beside),
    }
    rise = result["gaps_with_images_ms"]["p95"] / result["gaps_alone_ms"]["p95"] - 1  # type: ignore[index]
    result["p95_rise"] = round(rise, 3)
    print(
        f"{args.model}: {rate:.2f} image requests/s, encode {encode_ms:.1f} ms/image; "
        f"{args.streams} text streams' p95 gap "
        f"{result['gaps_alone_ms']['p95']} ms alone, {result['gaps_with_images_ms']['p95']} ms while images arrive "  # type: ignore[index]
        f"({rise:+.0%}; target at most +20%)"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "images.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
