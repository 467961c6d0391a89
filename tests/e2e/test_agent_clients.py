"""The real agent CLIs, Claude Code and Codex, finishing a turn against the server.

Both come from npm (`@anthropic-ai/claude-code`, `@openai/codex`), installed
once into ~/.cache/mlx-relay/npm by the first test that needs them. They
run headless against a server of the tiny demo model with a 64k window
(their prompts are 10k–30k tokens), whose turns end after a few dozen
tokens. The weights are random, so the answer is gibberish: the checks
are that the CLI exits 0 and that the server answered every request 200.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import Server

NPM_CACHE = Path.home() / ".cache" / "mlx-relay" / "npm"
PACKAGES = ("@anthropic-ai/claude-code", "@openai/codex")
# A CPU prefill of Claude Code's ~25k-token prompt takes minutes on a busy machine.
CLI_TIMEOUT = 1500
ACCESS = re.compile(r'"(GET|POST|DELETE|PUT) (\S+) HTTP/[\d.]+" (\d{3})|"(GET|POST|DELETE|PUT) (\S+) [\d.]+" (\d{3})')

pytestmark = [pytest.mark.slow, pytest.mark.timeout(CLI_TIMEOUT + 120)]


@pytest.fixture(scope="session")
def npm_bin() -> Path:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the agent CLIs come from npm")
    bin_dir = NPM_CACHE / "node_modules" / ".bin"
    if not all((bin_dir / name).exists() for name in ("claude", "codex")):
        NPM_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [npm, "install", "--prefix", str(NPM_CACHE), *PACKAGES], check=True, timeout=900, capture_output=True
        )
    return bin_dir


def statuses(server: Server) -> list[tuple[str, int]]:
    """Every (path, status) in the server's access log."""
    found = []
    for match in ACCESS.finditer(server.logs()):
        path = match.group(2) or match.group(5)
        status = match.group(3) or match.group(6)
        found.append((path, int(status)))
    return found


def run_cli(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT
    )


def test_claude_code_finishes_a_turn(npm_bin: Path, agent_server: Server, tmp_path: Path) -> None:
    before = len(statuses(agent_server))
    result = run_cli(
        [str(npm_bin / "claude"), "-p", "Say hello."],
        {
            "HOME": str(tmp_path),
            "ANTHROPIC_BASE_URL": agent_server.base_url,
            "ANTHROPIC_API_KEY": "sk-unused",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    served = statuses(agent_server)[before:]
    assert any(path.startswith("/v1/messages") for path, _ in served), served
    assert all(status == 200 for _, status in served), served


def test_codex_finishes_a_turn(npm_bin: Path, agent_server: Server, tmp_path: Path) -> None:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-5-codex"\n'
        'model_provider = "relay"\n'
        "[model_providers.relay]\n"
        'name = "mlx-relay"\n'
        f'base_url = "{agent_server.v1}"\n'
        'wire_api = "responses"\n'
        'env_key = "RELAY_API_KEY"\n'
        # The Responses-over-WebSocket transport, which Codex dials first when a provider offers it.
        "supports_websockets = true\n"
        "[features]\n"
        "responses_websockets = true\n"
    )
    before = len(statuses(agent_server))
    result = run_cli(
        [str(npm_bin / "codex"), "exec", "--skip-git-repo-check", "Say hello."],
        {"CODEX_HOME": str(home), "RELAY_API_KEY": "unused", "HOME": str(tmp_path)},
        tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    served = statuses(agent_server)[before:]
    # The turn went over the socket (the upgrade answered 101, and the server logged its turns there),
    # and Codex never fell back to HTTP's POST.
    assert ("/v1/responses", 101) in served, served
    assert not any(path == "/v1/responses" and status != 101 for path, status in served), served
    assert '"event": "socket.turn"' in agent_server.logs()
    assert all(status in (101, 200) for _, status in served), served
