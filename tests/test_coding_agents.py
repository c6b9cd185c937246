"""Coding agents, as their users run them, one non-interactive turn each against a real `everycycle serve`: Codex CLI
(`@openai/codex`, `codex exec`, through the Responses API) and opencode (`opencode-ai`, `opencode run`, through
chat completions with the `@ai-sdk/openai-compatible` provider), each pinned and installed from the npm registry
into ~/.cache/everycycle. Their real prompts (10,000 tokens and more, with dozens of tool definitions) do not fit the
default model's 8,192, so the box serves a random-weight GGUF with the default model's tokenizer and a 32,768-token
context (tests/tiny_gguf.py write_long_context_llama): the answer is nonsense; the protocol is what is tested."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.servers import everycycle, http_get, metric_value, running_serve
from tests.tiny_gguf import write_long_context_llama

pytestmark = pytest.mark.system

CLIENTS = {"@openai/codex": "0.171.0", "opencode-ai": "1.18.33"}
CACHE = Path(os.environ.get("EVERYCYCLE_CACHE", Path.home() / ".cache" / "everycycle"))
MODEL = "random-long"


@pytest.fixture(scope="module")
def npm_bin() -> Path:
    """The pinned clients' executables, installed once per version set (about 15 s; 780 MB)."""
    prefix = CACHE / "npm-clients" / "-".join(f"{n.strip('@').replace('/', '_')}-{v}" for n, v in CLIENTS.items())
    bin_dir = prefix / "node_modules" / ".bin"
    if not ((bin_dir / "codex").exists() and (bin_dir / "opencode").exists()):
        npm = shutil.which("npm")
        assert npm, "npm is missing: tests/system-packages.sh installs it (nodejs npm)"
        prefix.mkdir(parents=True, exist_ok=True)
        subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
                        *(f"{n}@{v}" for n, v in CLIENTS.items())], check=True, timeout=900)
    return bin_dir


@pytest.fixture(scope="module")
def long_box(tmp_path_factory, npm_bin):
    d = tmp_path_factory.mktemp("coding")
    # About one answer token in sixteen is the end: short answers, so each turn ends in seconds.
    model = write_long_context_llama(d / f"{MODEL}.gguf", n_ctx=32768, eos_logit=13.5)
    keys = d / "api_keys.json"
    key = subprocess.run(everycycle("keys", "create", "--keys", str(keys), "agents"), capture_output=True,
                         text=True, check=True).stdout.strip()
    (d / "run").mkdir()
    with running_serve(["--model", str(model), "--keys", str(keys), "--threads", "2", "--parallel", "1",
                        "--metrics-access", "open"], d / "run", "the long-context server") as (base, _):
        yield base, key, d


def _figures(base: str) -> tuple[float, float]:
    text = http_get(base + "/metrics")[1].decode()
    return (metric_value(text, "everycycle_requests_total"), metric_value(text, "everycycle_prompt_tokens_total"))


def _run(argv: list, cwd: Path, env: dict, timeout: float = 420) -> subprocess.CompletedProcess:
    # PWD too: opencode takes its project directory from it, not from the process's own working directory.
    return subprocess.run(argv, cwd=cwd, env={**os.environ, "PWD": str(cwd), **env}, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def test_codex_exec_finishes_a_turn_through_the_responses_api(long_box, npm_bin):
    base, key, d = long_box
    home, work = d / "codex-home", d / "codex-work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "everycycle"\n\n[model_providers.everycycle]\nname = "EveryCycle"\n'
        f'base_url = "{base}/v1"\nenv_key = "EVERYCYCLE_API_KEY"\nwire_api = "responses"\n')
    before = _figures(base)
    done = _run([str(npm_bin / "codex"), "exec", "--skip-git-repo-check", "Say hello"], work,
                {"CODEX_HOME": str(home), "EVERYCYCLE_API_KEY": key})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ERROR" not in done.stdout + done.stderr, done.stdout[-3000:] + done.stderr[-3000:]
    requests, prompt_tokens = (a - b for a, b in zip(_figures(base), before))
    # One turn: Codex's own prompt (its instructions and dozens of tools, over 5,000 tokens) answered.
    assert requests >= 1 and prompt_tokens / requests > 5000, (requests, prompt_tokens)


def test_opencode_run_finishes_a_turn_through_chat_completions(long_box, npm_bin):
    base, key, d = long_box
    home, work = d / "opencode-home", d / "opencode-work"
    home.mkdir()
    work.mkdir()
    (work / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"everycycle": {"npm": "@ai-sdk/openai-compatible", "name": "EveryCycle",
                                    "options": {"baseURL": f"{base}/v1", "apiKey": key},
                                    "models": {MODEL: {"name": MODEL}}}},
        "model": f"everycycle/{MODEL}"}))
    before = _figures(base)
    # Its provider package is fetched from the npm registry at first use: kept in the same cache between runs.
    done = _run([str(npm_bin / "opencode"), "run", "Say hello"], work,
                {"HOME": str(home), "XDG_CACHE_HOME": str(CACHE / "opencode-cache")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    requests, prompt_tokens = (a - b for a, b in zip(_figures(base), before))
    assert requests >= 1 and prompt_tokens / requests > 3000, (requests, prompt_tokens)
