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


def test_the_ledger_stays_small_and_keeps_the_minute_exact():
    """It is kept in a file every process rewrites (#56, item 11): a key's busy day is at most one entry a minute
    past the minute window, and the minute window stays exact."""
    ledger = KeyLedger()
    for i in range(86400 // 5):  # a request every 5 s for a day
        ledger.add("busy", 10, now=float(i * 5))
    now = 86400 - 5.0
    doc = ledger.to_doc()
    assert len(doc["keys"]["busy"]) <= 1440 + 60
    assert ledger.used("busy", "minute", now) == 120  # the last 12 requests, exactly
    assert abs(ledger.used("busy", "day", now) - 172800) <= 120  # folding moves at most a minute's worth
    again = KeyLedger.from_doc(doc)
    assert again.used("busy", "minute", now) == 120 and again.to_doc() == doc
    with pytest.raises(ValueError):
        KeyLedger.from_doc({"keys": []})


def _add_from_a_process(path: str, n: int) -> None:
    from host_runtime.engine.key_ledger_file import SharedKeyLedger

    ledger = SharedKeyLedger(path)
    for _ in range(n):
        ledger.add("team", 1, time.time())
    ledger.flush()


def test_one_ledger_for_the_box_across_processes_and_restarts(tmp_path):
    """Token limits were each engine's, in memory: another model, an engine idled out or restarted, started the
    key from nothing. Now every process counts into one file, none losing another's uses."""
    import multiprocessing

    from host_runtime.engine.key_ledger_file import LEDGER_NAME, SharedKeyLedger

    path = str(tmp_path / "usage" / LEDGER_NAME)
    workers = [multiprocessing.get_context("spawn").Process(target=_add_from_a_process, args=(path, 40))
               for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert [w.exitcode for w in workers] == [0] * 4
    restarted = SharedKeyLedger(path)  # a new engine, or the API's worker
    refusal = restarted.refusal("team", 160, 0, time.time())
    assert refusal is not None and refusal.used == 160  # 4 processes x 40, none lost
    assert restarted.refusal("team", 161, 0, time.time()) is None
    restarted.add("team", 5, time.time())  # seen by its own process before the file has it
    assert restarted.refusal("team", 165, 0, time.time()).used == 165


def test_a_ledger_it_cannot_write_counts_in_memory_and_an_unreadable_one_from_now(tmp_path, caplog):
    from host_runtime.engine.key_ledger_file import SharedKeyLedger

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    ledger = SharedKeyLedger(blocked / "ledger")  # its folder cannot be made
    ledger.add("k", 50, time.time())
    ledger.flush()
    assert ledger.refusal("k", 50, 0, time.time()).used == 50  # kept, in memory
    assert "cannot be written" in caplog.text
    torn = tmp_path / "torn"
    torn.write_text('{"version": 1, "keys": {"k": [[1')
    assert SharedKeyLedger(torn).refusal("k", 1, 0, time.time()) is None
    assert "cannot be read" in caplog.text


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
def test_tokenize_and_embeddings_count_and_a_limit_outlives_a_restart(tmp_path):
    """#56, item 11: embeddings, rerank and tokenize were neither counted nor bounded, and a key's limit started
    again from nothing when its engine restarted."""
    keys = str(tmp_path / "keys.json")
    done = _keys(keys, "create", "--keys", keys, "metered", "--tokens-per-minute", "150")
    assert done.returncode == 0, done.stderr
    key = done.stdout.strip()
    usage = tmp_path / "usage"

    def post(base, path, body):
        req = urllib.request.Request(base + path, json.dumps(body).encode(), {
            "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read()), e.headers

    text = "the quick brown fox jumps over the lazy dog " * 10  # about 100 tokens
    proc, base = _serve(tmp_path, keys, usage)
    try:
        status, doc, _ = post(base, "/v1/embeddings", {"model": MODEL_ID, "input": text})
        assert status == 200 and doc["usage"]["prompt_tokens"] >= 90
        status, doc, _ = post(base, "/tokenize", {"content": text})
        assert status == 200  # under the limit when asked: now over it
        status, doc, headers = post(base, "/tokenize", {"content": "hi"})
        assert status == 429 and doc["error"]["code"] == "token_limit_exceeded", doc
        # the minute frees once the embeddings' tokens (a few seconds old) leave it, not a whole day or none
        assert 40 <= int(headers["Retry-After"]) <= 60, headers["Retry-After"]
        status, doc, _ = post(base, "/v1/chat/completions", {
            "model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert status == 429 and doc["error"]["code"] == "token_limit_exceeded", doc  # the engine sees the API's
    finally:
        proc.stop()
    proc, base = _serve(tmp_path, keys, usage)
    try:
        status, doc, _ = post(base, "/v1/embeddings", {"model": MODEL_ID, "input": "hi"})
        assert status == 429 and "limit is 150 a minute" in doc["error"]["message"], doc
    finally:
        proc.stop()


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
