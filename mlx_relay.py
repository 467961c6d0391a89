"""`mlx-relay serve` (`python -m mlx_relay serve`): the same app and settings as `hypercorn app:app`, with the
edge's safety checks. Beside `app.py`, above everything it starts: no layer imports it.

Flags are written into the `MLX_RELAY_*` environment before the app reads
its settings, so a flag overrides the environment and the app has one
source of configuration either way. Problems a user can fix (a bad
setting, a public address with no key, a live server on the socket, a
corrupt response store) end with one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from stages.models.blas import preload_blas

# Before anything imports mlx (the model commands' imports reach it): the BLAS is chosen when mlx first loads, and
# the workers the server forks keep the front's. Chosen after mlx, it is the reference BLAS the Linux wheel links,
# about 35x slower a matmul.
preload_blas()

from edge.edge_policy import EdgePolicy  # noqa: E402
from edge.sockets import SocketInUse, bind_tcp, bind_unix  # noqa: E402
from fleet.spec import ModelsFileError, specs_from_settings  # noqa: E402
from pipeline.env_values import PREFIX, SettingsError  # noqa: E402
from pipeline.settings import Settings  # noqa: E402
from stages.adapters import AdapterError, read_adapters  # noqa: E402
from stages.models.embedding import EmbeddingModelError, read_embedding_model  # noqa: E402
from stages.models.pull_cli import MODEL_COMMANDS  # noqa: E402
from stages.models.pull_cli import add_commands as add_model_commands  # noqa: E402
from stages.models.pull_cli import run as run_model_command  # noqa: E402
from store.store_startup import StartupError, open_response_store  # noqa: E402

USAGE_ERROR = 2


class ServeError(Exception):
    """A reason not to start, told to the user in one line."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return USAGE_ERROR
    if args.command in MODEL_COMMANDS:
        return run_model_command(args)
    try:
        status = serve(args)
    except (
        ServeError,
        SettingsError,
        StartupError,
        SocketInUse,
        AdapterError,
        EmbeddingModelError,
        ModelsFileError,
        OSError,
    ) as error:
        print(f"mlx-relay: {error}", file=sys.stderr)
        return USAGE_ERROR
    _exit_now(status)


def _exit_now(status: int) -> NoReturn:
    """End the process once the server has drained and stopped.

    The engine, the store and the socket are already closed. Interpreter
    finalization would then destroy MLX's native stream threads while the
    idle worker thread that ran the model still refers to them, which
    aborts the process now and then ("terminate called without an active
    exception", status -6) instead of exiting 0.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlx-relay", description="An LLM inference server on MLX.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve a model over the OpenAI and Anthropic APIs",
        description="Serve a model. Every MLX_RELAY_* variable still applies; a flag given here overrides it.",
    )
    serve.add_argument(
        "--model",
        action="append",
        help="a built-in model, a directory or a Hugging Face repo id (MLX_RELAY_MODEL); repeat it to serve several, "
        "each chosen by the request's model (comma-separated in MLX_RELAY_MODEL); "
        "default: SmolLM2-135M-Instruct (built-in 'smollm2', or MLX_RELAY_DEMO_MODEL)",
    )
    serve.add_argument(
        "--models-file",
        help="a TOML file naming several models and their settings (MLX_RELAY_MODELS_FILE; docs/models.md)",
    )
    for flag, meaning in _DEFAULT_FLAGS.items():
        variable = PREFIX + flag.upper().replace("-", "_")
        serve.add_argument(f"--{flag}", help=f"{meaning}, unless a request sets it ({variable})")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="TCP port (default 8080)")
    serve.add_argument(
        "--unix", metavar="PATH", help="listen on a Unix socket only its owner may use (mode 0600) instead of TCP"
    )
    serve.add_argument("--api-key", help="key(s) clients must send: 'k1,k2' or '@/path/to/keyfile' (MLX_RELAY_API_KEY)")
    serve.add_argument(
        "--insecure-no-auth", action="store_true", help="allow a non-loopback address without an API key"
    )
    serve.add_argument(
        "--reset-store",
        action="store_true",
        help="if the SQLite response store will not open, move it aside (<name>.corrupt-<time>) and start empty",
    )
    serve.add_argument(
        "--shard",
        choices=("tensor", "pipeline"),
        help="shard the model over the ranks mlx.launch started (MLX_RELAY_SHARD): "
        "rank 0 serves HTTP, the others follow",
    )
    serve.add_argument(
        "--in-process",
        action="store_true",
        help="run the model in this process, not in a worker process of its own (MLX_RELAY_IN_PROCESS; debugging)",
    )
    serve.add_argument(
        "--embedding-model",
        help="a dedicated embedding model served beside the chat model: "
        "a directory, a repo id or shaped:NAME (MLX_RELAY_EMBEDDING_MODEL)",
    )
    serve.add_argument(
        "--kv-bits",
        choices=("4", "8"),
        help="quantize the KV cache to 4 or 8 bits (MLX_RELAY_KV_BITS; default full precision)",
    )
    serve.add_argument(
        "--weights",
        choices=("auto", "float32", "bfloat16", "float16", "stored"),
        help="the form a quantized model's weights are served in (MLX_RELAY_WEIGHTS; default auto: on the CPU "
        "backend float32 where its plan admits the whole window, else the fastest form that does)",
    )
    serve.add_argument(
        "--kv-group-size",
        choices=("32", "64", "128"),
        help="values per scale and bias of the quantized KV (default 64)",
    )
    serve.add_argument(
        "--quantized-kv-start", help="tokens a row holds before its KV is quantized (MLX_RELAY_QUANTIZED_KV_START)"
    )
    serve.add_argument(
        "--prompt-lookup",
        action=argparse.BooleanOptionalAction,
        help="speculate with n-gram proposals from each row's own prompt and output; by default on where it can run "
        "and the measured gate finds a gain, --prompt-lookup asks for it (refused at start where it cannot run), "
        "--no-prompt-lookup turns it off (MLX_RELAY_PROMPT_LOOKUP: auto, 1, 0)",
    )
    serve.add_argument(
        "--draft-model",
        help="speculate with a smaller model of the same vocabulary: a built-in name, directory or repo id "
        "(MLX_RELAY_DRAFT_MODEL)",
    )
    serve.add_argument(
        "--num-draft-tokens", help="tokens a row proposes at most per step (MLX_RELAY_NUM_DRAFT_TOKENS; default 8)"
    )
    serve.add_argument(
        "--adapters", help="LoRA adapters served as their own model ids: 'name=path,...' (MLX_RELAY_ADAPTERS)"
    )
    serve.add_argument(
        "--strict-fields",
        action="store_true",
        help="refuse request fields this server does not know with a 400 naming them (MLX_RELAY_STRICT_FIELDS)",
    )
    serve.add_argument(
        "--mcp-allow",
        metavar="PREFIXES",
        help="URL prefixes, comma-separated, of the remote MCP servers a request may have this server call "
        "(MLX_RELAY_MCP_ALLOW; default none; docs/apis.md)",
    )
    serve.add_argument("--loop", choices=("asyncio", "uvloop"), help="the event loop (MLX_RELAY_LOOP; default asyncio)")
    serve.add_argument("--no-web", action="store_true", help="no chat page at / (MLX_RELAY_WEB=0)")
    serve.add_argument(
        "--graceful-timeout", type=float, default=30.0, help="seconds open streams get at shutdown (default 30)"
    )
    serve.add_argument(
        "--access-log",
        metavar="PATH",
        help="a line per request (hypercorn's format: client, request line, status, size) to PATH, '-' for stdout",
    )
    serve.add_argument(
        "--log-format",
        metavar="{auto,json,console}",
        help="log lines for a person (console) or a log shipper (json); auto: console on a terminal, else JSON; "
        "the access log follows it (MLX_RELAY_LOG_FORMAT)",
    )
    # pull, models, rm: the Hugging Face cache (stages/models/pull_cli.py).
    add_model_commands(commands)
    return parser


# One model's defaults (a models file sets them per model).
_DEFAULT_FLAGS = {
    "default-temperature": "the sampling temperature",
    "default-top-p": "top_p",
    "default-top-k": "top_k",
    "default-max-tokens": "the tokens a reply may have",
    "default-adapter": "the adapter a request naming the base model gets",
    "context-limit": "a context window below the model's own",
}


def serve(args: argparse.Namespace) -> int:
    _export(args)
    settings = Settings.from_env()
    if settings.shard and _follower_rank():
        return _follow(settings)
    # Keys and origins are read here too, so a bad one is one line, not a lifespan traceback.
    policy = EdgePolicy.from_settings(settings)
    if args.unix is None:
        _check_exposure(args.host, has_keys=bool(policy.keys), insecure=args.insecure_no_auth)
    # Opened here first so a corrupt store is reported (or reset) before any model loads.
    open_response_store(settings).close()
    # A bad adapter list is one line too, before the model loads.
    read_adapters(settings.adapters)
    # A models file (or a list of models) that cannot be served is one line too.
    specs_from_settings(settings)
    if settings.embedding_model:
        read_embedding_model(settings.embedding_model, fallback="last", matryoshka=settings.embedding_matryoshka)
    listener = bind_unix(args.unix) if args.unix else bind_tcp(args.host, args.port)
    try:
        return _run(_config(args, listener), loop=settings.loop)
    finally:
        # Hypercorn closed the descriptor when it stopped serving; only a Unix socket's file is left.
        listener.detach()
        if args.unix:
            _unlink(args.unix)


def _export(args: argparse.Namespace) -> None:
    flags = {
        "model": ",".join(args.model) if args.model else None,
        "models_file": args.models_file,
        "api_key": args.api_key,
        "reset_store": "1" if args.reset_store else None,
        "shard": args.shard,
        "strict_fields": "1" if args.strict_fields else None,
        "mcp_allow": args.mcp_allow,
        "loop": args.loop,
        "embedding_model": args.embedding_model,
        "adapters": args.adapters,
        "kv_bits": args.kv_bits,
        "weights": args.weights,
        "kv_group_size": args.kv_group_size,
        "quantized_kv_start": args.quantized_kv_start,
        "prompt_lookup": None if args.prompt_lookup is None else ("1" if args.prompt_lookup else "0"),
        "draft_model": args.draft_model,
        "num_draft_tokens": args.num_draft_tokens,
        "web": "0" if args.no_web else None,
        "in_process": "1" if args.in_process else None,
        "log_format": args.log_format,
    }
    flags.update({flag.replace("-", "_"): getattr(args, flag.replace("-", "_")) for flag in _DEFAULT_FLAGS})
    for name, value in flags.items():
        if value is not None:
            os.environ[PREFIX + name.upper()] = value


def _follower_rank() -> bool:
    from stages.shard import launched_rank

    return launched_rank() != 0


def _follow(settings: Settings) -> int:
    """A follower rank: no HTTP, no store; the model loop until rank 0 stops it."""
    from stages.engine.follower_process import serve_follower

    return serve_follower(settings)


def _check_exposure(host: str, *, has_keys: bool, insecure: bool) -> None:
    if has_keys or insecure or is_loopback(host):
        return
    raise ServeError(
        f"refusing to listen on {host} without an API key: anyone who can reach it could use the model. "
        "Set --api-key (or MLX_RELAY_API_KEY), or pass --insecure-no-auth if this network is trusted."
    )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost may resolve anywhere


def _config(args: argparse.Namespace, listener: socket.socket) -> object:
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"fd://{listener.fileno()}"]
    config.graceful_timeout = args.graceful_timeout
    # Pings keep an idle Responses socket open through proxies that cut silent connections.
    config.websocket_ping_interval = 20.0
    config.accesslog = args.access_log
    return config


def _run(config: object, *, loop: str = "asyncio") -> int:
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.utils import LifespanFailureError

    from app import app, start_draining

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            # New requests on connections still open (keep-alive, h2) get 503 from now on, not a place in the queue.
            start_draining()
            stop.set()

        # The same signals `hypercorn app:app` stops on: stop accepting, drain, then stop the engine.
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal)
        await hypercorn_serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    try:
        with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
            runner.run(run())
    except LifespanFailureError as error:
        raise ServeError(f"start-up failed: {error}") from None
    return 0


def loop_factory(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    if loop == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        raise ServeError("MLX_RELAY_LOOP=uvloop needs uvloop: pip install 'mlx-relay[uvloop]'") from None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


if __name__ == "__main__":
    raise SystemExit(main())
