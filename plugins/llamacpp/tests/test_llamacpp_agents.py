"""The real coding agents against ``werk serve`` on the real SmolLM2-135M-Instruct (issue 30).

Claude Code (``claude -p``, Anthropic Messages with its default tool set, thinking, a system
entry in ``messages``, ``max_tokens: 32000``) and Codex CLI (``codex exec``, the Responses API
with its default tools, streamed) each answer a prompt through a keyed ``werk serve``, with
their own default model names routed by an alias's ``match`` patterns (docs/deployments.md,
"Routing"). The agents come from the npm registry, pinned and cached by
``scripts/setup-agents.sh``; without npm these tests skip with that reason. Each agent runs with
a home of its own (no user configuration) and the server's key in its usual variable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from werk_llamacpp.process import ENV_ARGS

from werk_host.plugin import ModelManifest
from werk_host.testing.host import ModelRegistry
from werk_host.testing.hosts import serve_process

pytestmark = pytest.mark.llamaserver
KEY = "sk-werk-agents-test-5521"
ROOT = Path(__file__).resolve().parents[3]
#: Each agent's run, bounded (SmolLM2 on two cores: a few seconds of prompt, tens of output).
AGENT_TIMEOUT_S = 600
PROFILE = """
[[instance]]
id = "smollm2"
model = "smollm2"
backend = "llama.cpp"
preload = true

[alias.agents]
replicas = ["smollm2"]
match = ["claude-*", "gpt-*"]
"""


#: Claude Code's prompts, tried in turn while the model's answer runs past the output limit.
CLAUDE_PROMPTS = (
    "What is 2+2? Answer with a number only.",
    "What is 3+5? Answer with a number only.",
    "What is 2+3? Answer with a number only.",
    "What is 7+1? Answer with a number only.",
)
#: Claude Code's own message when an answer stops at max_tokens.
OUTPUT_LIMIT = "output token maximum"


@dataclass
class Agents:
    claude: Path
    codex: Path


@dataclass
class Served:
    url: str
    log: Path


@pytest.fixture(scope="module")
def agents() -> Agents:
    if shutil.which("npm") is None:
        pytest.skip("npm not found: the agent smoke tests install Claude Code and Codex CLI with npm")
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "setup-agents.sh")], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/setup-agents.sh failed ({done.returncode}): {done.stderr[-2000:]}")
    claude, codex = done.stdout.strip().splitlines()[-2:]
    return Agents(Path(claude), Path(codex))


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, llama_server_path: Path, smollm2_gguf: Path) -> Iterator[Served]:
    """``werk serve --profile`` with SmolLM2 behind an alias that claims the agents' names."""
    root = tmp_path_factory.mktemp("agents")
    home = root / "home"
    home.mkdir()
    ModelRegistry(home).add(ModelManifest.from_paths("smollm2", [smollm2_gguf], backend="llama.cpp"))
    profile = root / "deployments.toml"
    profile.write_text(PROFILE)
    # Greedy sampling where the agent sends no temperature (neither does): SmolLM2 at
    # llama-server's default 0.8 sometimes rambles to the output limit, and Claude Code then
    # continues (or, with a small CLAUDE_CODE_MAX_OUTPUT_TOKENS, fails) at random.
    environ = {"WERK_LLAMA_SERVER": str(llama_server_path), ENV_ARGS: "--temp 0"}
    with serve_process(home, "--profile", str(profile), keys=(KEY,), env=environ) as served:
        yield Served(served.url, served.log)


def _agent_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment for an agent: its own home, no inherited API keys or proxies."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "SSL_CERT_FILE")
    environ = {k: v for k, v in os.environ.items() if k in keep}
    home.mkdir(parents=True, exist_ok=True)
    return {**environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), **extra}


def _server_errors(served: Served) -> list[str]:
    """Lines of the server log that report an error (a traceback, or a record at error level)."""
    text = served.log.read_text(errors="replace")
    return [line for line in text.splitlines() if "Traceback" in line or '"level": "error"' in line]


def test_claude_code_answers_through_werk_serve(agents: Agents, served: Served, tmp_path: Path) -> None:
    environ = _agent_env(
        tmp_path / "claude-home",
        ANTHROPIC_BASE_URL=served.url,
        ANTHROPIC_API_KEY=KEY,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
        # As a user of a small local model sets it: Claude Code continues an answer stopped at
        # max_tokens with the whole answer in the prompt, which would put a long SmolLM2 answer
        # past its 8192-token context (a truthful 400); a short limit also keeps a rambling
        # answer (see below) cheap.
        CLAUDE_CODE_MAX_OUTPUT_TOKENS="256",
    )
    # Claude Code's system prompt names its working directory: a fixed one keeps the greedy
    # answer the same from run to run (a pytest tmp path would change it every time).
    workdir = Path(tempfile.gettempdir()) / "werk-agents-claude"
    workdir.mkdir(exist_ok=True)
    # The system prompt also carries the date and the OS version, so a greedy SmolLM2 answer can
    # still ramble past the output limit on some day or machine. Claude Code then exits 1 with
    # its own message (the model's length, truthfully reported as max_tokens): only that outcome
    # moves on to the next prompt; any other failure, or a server error, fails at once.
    failures = []
    for prompt in CLAUDE_PROMPTS:
        done = subprocess.run(
            [str(agents.claude), "-p", prompt],
            capture_output=True,
            text=True,
            env=environ,
            cwd=workdir,
            timeout=AGENT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        assert not _server_errors(served)
        if done.returncode == 0:
            assert done.stdout.strip(), done.stderr[-2000:]
            return
        output = f"{done.stdout[-2000:]} {done.stderr[-2000:]}"
        assert OUTPUT_LIMIT in output, f"claude exited {done.returncode}: {output}"
        failures.append(prompt)
    pytest.fail(f"SmolLM2 ran past the output limit on every prompt: {failures}")


def test_codex_answers_through_werk_serve(agents: Agents, served: Served, tmp_path: Path) -> None:
    codex_home = tmp_path / "codex-home"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "gpt-5.1-codex"\n'
        'model_provider = "werk"\n'
        "[model_providers.werk]\n"
        'name = "werk"\n'
        f'base_url = "{served.url}/v1"\n'
        'env_key = "WERK_API_KEY"\n'
        'wire_api = "responses"\n'
    )
    environ = _agent_env(tmp_path / "home", CODEX_HOME=str(codex_home), WERK_API_KEY=KEY)
    done = subprocess.run(
        [str(agents.codex), "exec", "--skip-git-repo-check", "Say hello in one short sentence."],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path,
        timeout=AGENT_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, f"codex exited {done.returncode}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    assert done.stdout.strip(), done.stderr[-2000:]
    assert not _server_errors(served)
