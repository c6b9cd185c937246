"""A team's keys: tokens per minute and per day, allowed models, and usage kept across restarts. The ledger alone
(pure), the key file's limits through the CLI, then three keys against a real server."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request

import openai
import pytest

from host_runtime.auth.keystore import load_keys
from host_runtime.engine.key_ledger import KeyLedger
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, http_get, ready, wait_for


def test_the_ledger_refuses_past_a_window_and_says_when_it_frees():
    ledger = KeyLedger()
    assert ledger.refusal("a", 100, 0, now=0.0) is None
    ledger.add("a", 60, now=0.0)
    ledger.add("a", 50, now=30.0)
    refusal = ledger.refusal("a", 100, 0, now=31.0)
    # 110 in the last minute; once the first 60 leave (at t=60) it holds 50: 29 s from t=31.
    assert (refusal.window, refusal.used, refusal.limit, refusal.retry_after) == ("minute", 110, 100, 29)
    assert ledger.refusal("a", 100, 0, now=61.0) is None
    assert ledger.refusal("b", 1, 1, now=31.0) is None  # another key's tokens are its own
    day = ledger.refusal("a", 0, 100, now=3600.0)
    assert day.window == "day" and day.retry_after == 86400 - 3600
    assert ledger.refusal("a", 0, 100, now=86431.0) is None
    assert "limit is 100 a minute" in refusal.message("a")


def _keys(path, *argv) -> subprocess.CompletedProcess:
    return subprocess.run(everycycle("keys", *argv), capture_output=True, text=True, timeout=60)


def test_limits_are_set_and_cleared_through_the_cli(tmp_path):
    keys = str(tmp_path / "keys.json")
    assert _keys(keys, "create", "--keys", keys, "team", "--tokens-per-minute", "500", "--models", "a,b").returncode == 0
    (key,) = load_keys(keys)
    assert (key.tokens_per_minute, key.tokens_per_day, key.models) == (500, 0, ("a", "b"))
    done = _keys(keys, "set-limit", "--keys", keys, "team", "--tokens-per-day", "9000", "--models", "")
    assert done.returncode == 0 and "500 tokens/min, 9,000 tokens/day" in done.stderr
    (key,) = load_keys(keys)
    assert (key.tokens_per_minute, key.tokens_per_day, key.models) == (500, 9000, ())
    for argv, said in ((["set-limit", "--keys", keys, "team"], "give at least one limit"),
                       (["set-limit", "--keys", keys, "team", "--tokens-per-minute", "-1"], "--tokens-per-minute must")):
        refused = _keys(keys, *argv)
        assert refused.returncode == 2 and said in refused.stderr and "Traceback" not in refused.stderr
    assert "500 tokens/min" in _keys(keys, "list", "--keys", keys).stdout


def _serve(d, keys: str, usage):
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--keys", keys, "--threads", "2", "--ctx-size", "1024",
                           "--parallel", "2", "--metrics-access", "open", "--usage-dir", str(usage),
                           "--run-dir", str(d / f"run-{port}")), d / f"serve-{port}.log")
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: ready(base), 120, "the server", proc)
    return proc, base


@pytest.mark.system
def test_three_keys_a_token_limit_a_model_limit_and_usage_that_survives_a_restart(tmp_path):
    keys = str(tmp_path / "keys.json")
    made = {}
    for name, limits in (("metered", ["--tokens-per-minute", "100"]), ("free", []),
                         ("narrow", ["--models", "gpt-4o-mini"])):
        done = _keys(keys, "create", "--keys", keys, name, *limits)
        assert done.returncode == 0, done.stderr
        made[name] = done.stdout.strip()
    usage = tmp_path / "usage"
    proc, base = _serve(tmp_path, keys, usage)
    try:
        def client(name):
            return openai.OpenAI(base_url=base + "/v1", api_key=made[name], max_retries=0, timeout=120)

        ask = dict(model=MODEL_ID, messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=40)
        client("metered").chat.completions.create(**ask)  # about 75 tokens with its prompt: under the 100
        first_done = time.monotonic()
        time.sleep(5)  # so that "when the first request leaves the window" is told from "a whole minute"
        client("metered").chat.completions.create(**ask)
        third_sent = time.monotonic()
        with pytest.raises(openai.RateLimitError) as err:
            client("metered").chat.completions.create(**ask)
        assert err.value.body["code"] == "token_limit_exceeded" and "limit is 100 a minute" in err.value.message
        # Once the first request's tokens leave the minute, the second's 75 are under the limit: that is the wait.
        expected = 60 - (third_sent - first_done)
        assert abs(int(err.value.response.headers["retry-after"]) - expected) <= 2, expected
        for _ in range(3):  # the other keys are served meanwhile
            assert client("free").chat.completions.create(**ask).choices[0].message.content is not None
        with pytest.raises(openai.PermissionDeniedError) as err:
            client("narrow").chat.completions.create(**ask)
        assert err.value.body["code"] == "model_not_allowed" and "gpt-4o-mini" in err.value.message
        # nor may it have another model tokenized or counted (#56, item 10: that loaded any store model)
        for path, body in (("/tokenize", {"model": MODEL_ID, "content": "hi"}),
                           ("/detokenize", {"model": MODEL_ID, "tokens": [1]}),
                           ("/v1/messages/count_tokens", {"model": MODEL_ID,
                                                          "messages": [{"role": "user", "content": "hi"}]})):
            req = urllib.request.Request(base + path, json.dumps(body).encode(), {
                "Content-Type": "application/json", "Authorization": f"Bearer {made['narrow']}"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(req, timeout=30)
            assert refused.value.code == 403 and b"may not use the model" in refused.value.read(), path
    finally:
        proc.stop()
    # Stopped with SIGTERM, as the pool and supervisord stop it: what the keys used since the last save is kept.
    saved = json.loads(next(usage.glob("*.json")).read_text())["keys"]
    assert saved["free"]["key_requests_total"] == 3 and saved["metered"]["key_requests_total"] == 2

    # After a restart the counters go on from what was kept; `keys usage` reads the same files.
    proc, base = _serve(tmp_path, keys, usage)
    try:
        openai.OpenAI(base_url=base + "/v1", api_key=made["free"], max_retries=0, timeout=120).chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        wait_for(lambda: json.loads(next(usage.glob("*.json")).read_text())["keys"]["free"]["key_requests_total"] == 4,
                 30, "the usage file to follow", proc)
        text = http_get(base + "/metrics")[1].decode()
        assert any(line.startswith("everycycle_key_requests_total") and 'key="free"' in line and line.endswith(" 4.0")
                   for line in text.splitlines()), [row for row in text.splitlines() if "key_requests" in row]
    finally:
        proc.stop()
    shown = subprocess.run(everycycle("keys", "usage", "--usage-dir", str(usage), "--json"), capture_output=True,
                           text=True, timeout=60)
    assert json.loads(shown.stdout)["free"]["key_requests_total"] == 4
    table = subprocess.run(everycycle("keys", "usage", "--usage-dir", str(usage)), capture_output=True, text=True,
                           timeout=60).stdout
    assert table.splitlines()[0].startswith("KEY") and any(row.startswith("free ") for row in table.splitlines())


@pytest.mark.system
def test_an_engine_with_a_usage_file_ends_at_once_on_sigterm(tmp_path):
    # The pool and supervisord stop engines with SIGTERM, and wait 10 s before SIGKILL: the usage is saved on the
    # way out (the three keys' test reads it back), and the engine still ends at once, with the status the signal
    # gave before (it had hung: its handler called signal.signal() on a helper thread, which refuses).
    import signal

    from host_runtime.engine.client import EngineClient
    from host_runtime.engine.options import EngineOptions
    from host_runtime.engine.model import ContextConfig, default_model_path

    options = EngineOptions(model=str(default_model_path()), context=ContextConfig(n_ctx_per_seq=512, n_parallel=1),
                            usage_file=str(tmp_path / "usage" / "m.json"))
    sock = tmp_path / "engine.sock"
    proc = subprocess.Popen(everycycle("engine", "--socket", str(sock), "--options-stdin"), stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.stdin.write(options.to_json().encode())
    proc.stdin.close()
    try:
        wait_for(lambda: sock.exists() and EngineClient(str(sock)).info(timeout=5.0).ready, 120, "the engine")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=8) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
