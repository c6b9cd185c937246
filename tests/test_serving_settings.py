"""box.toml's [serving] table: validated like every table, written into serving.toml by provisioning, and read by
the serve process (explicit options still win) without an argv round trip; then, against a real server started
from that file alone, the engine's context and sequences, the keep-alive and an alias."""

from __future__ import annotations

import json
import re
import time

import openai
import pytest

from host_runtime.cli import build_parser, engine_options, serve_arguments
from host_runtime.common.settings_file import load
from host_runtime.engine.client import EngineClient
from host_runtime.engine.limits import DEFAULT_CTX, DEFAULT_KV_BUDGET_MIB
from host_runtime.models.model_settings import ModelSettings
from host_runtime.models.store import Store
from host_runtime.pool.residency import KEEP_ALIVE_S
from host_runtime.serving.settings import ServingSettings
from provisioning.apply import apply
from provisioning.bundle import open_bundle
from provisioning.validate import validate
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, http_get, ready, wait_for
from tests.test_provisioning import _with, make_bundle
from tests.tiny_gguf import write_tiny_llama

SERVING = {"context_length": 512, "parallel": 2, "kv_budget_mib": 96, "speculation": "ngram", "keep_alive": "2s",
           "models_memory_mib": 4096, "aliases": {"agent": "tiny", "gpt-4o-mini": MODEL_ID, "claude-*": MODEL_ID,
                                                     "ti*": MODEL_ID}, "cache_type_k": "q8_0",
           "cache_type_v": "q8_0"}


def _provisioned(tmp_path, serving: dict) -> tuple[list, ServingSettings | None]:
    box = _with("serving", serving)
    bundle = open_bundle(make_bundle(tmp_path / "bundle", box))
    errors = validate(bundle)
    if errors:
        return errors, None
    root = tmp_path / "root"
    apply(bundle, root)
    return [], load(ServingSettings, root / "etc/everycycle/serving.toml")


def _as_serve_reads_it(settings_path, *extra: str):
    args = build_parser().parse_args(["serve", "--settings", str(settings_path), *extra])
    return serve_arguments(args, load(ServingSettings, args.settings))


def test_a_bundles_serving_table_reaches_serving_toml_and_the_serve_process(tmp_path):
    errors, settings = _provisioned(tmp_path, SERVING)
    assert errors == [] and settings.parallel == 2 and settings.aliases == SERVING["aliases"]
    args = _as_serve_reads_it(tmp_path / "root/etc/everycycle/serving.toml")
    assert (args.ctx_size, args.parallel, args.kv_budget_mib, args.speculation, args.keep_alive,
            args.models_memory_mib) == (512, 2, 96, "ngram", 2.0, 4096)
    options = engine_options(build_parser(), args, None)  # what the engine child is given on its stdin
    assert (options.context.n_ctx_per_seq, options.context.n_parallel, options.context.kv_budget_bytes) == \
        (512, 2, 96 << 20)
    assert options.speculation.enabled and options.speculation.kind == "ngram"
    assert (options.context.cache_type_k, options.context.cache_type_v) == ("q8_0", "q8_0")
    # Options given on the command line win; what neither gives is serve's default.
    args = _as_serve_reads_it(tmp_path / "root/etc/everycycle/serving.toml", "--parallel", "3", "--keep-alive", "-1",
                              "--speculation", "off")
    assert (args.parallel, args.keep_alive, args.speculation, args.ctx_size) == (3, None, "off", 512)
    args = _as_serve_reads_it(tmp_path / "nothing.toml")
    assert (args.ctx_size, args.parallel, args.kv_budget_mib, args.speculation, args.keep_alive,
            args.models_memory_mib) == (DEFAULT_CTX, None, DEFAULT_KV_BUDGET_MIB, "off", KEEP_ALIVE_S, None)


def test_a_keep_alive_in_seconds_or_forever_is_kept_as_serve_parses_it(tmp_path):
    for given, seconds in ((90, 90.0), (-1, None), ("1h", 3600.0)):
        _, settings = _provisioned(tmp_path / str(given), {"keep_alive": given})
        path = tmp_path / f"{given}.toml"
        from host_runtime.common.settings_file import save

        save(settings, path)
        assert _as_serve_reads_it(path).keep_alive == seconds


@pytest.mark.parametrize("serving,field", [
    ({"parallel": 0}, "serving.parallel"),
    ({"speculation": "draft"}, "serving.speculation"),
    ({"keep_alive": "tomorrow"}, "serving.keep_alive"),
    ({"kv_budget_mib": "lots"}, "serving.kv_budget_mib"),
    ({"aliases": {"bad name": "tiny"}}, "serving.aliases.bad name"),
    ({"aliases": {"claude-*": "bad/name"}}, "serving.aliases.claude-*"),
    ({"aliases": {"a": "b", "b": "tiny"}}, "serving.aliases.a"),
    ({"threads": 4}, "serving"),  # unknown: the message names it
    ({"cache_type_k": "q2_k"}, "serving.cache_type_k"),
])
def test_serving_settings_a_box_cannot_use_are_refused_naming_the_field(tmp_path, serving, field):
    errors, settings = _provisioned(tmp_path, serving)
    assert settings is None and any(e.field.startswith(field) for e in errors), [str(e) for e in errors]


def test_the_context_is_given_once(tmp_path):
    box = _with("serving", {"context_length": 1024})
    box["model"]["context_length"] = 2048
    errors = validate(open_bundle(make_bundle(tmp_path / "bundle", box)))
    assert [e.field for e in errors] == ["serving.context_length"], [str(e) for e in errors]


@pytest.mark.system
def test_a_server_started_from_the_serving_table_alone_serves_as_it_says(tmp_path):
    _, settings = _provisioned(tmp_path, SERVING)
    settings_path = tmp_path / "root/etc/everycycle/serving.toml"
    store = Store(tmp_path / "store")
    store.root.mkdir(parents=True)
    tiny = write_tiny_llama(tmp_path / "tiny.gguf", n_ctx=512, n_embd=256, n_layer=4, n_ff=512)
    store.admit(tiny, "tiny", "0" * 64, str(tiny), move=True)
    store.set_settings("tiny", ModelSettings(context_length=256, parallel=1))  # its own, over [serving]'s
    port = free_port()
    run = tmp_path / "run"
    # Only what is not a serving setting on the command line: the port, the threads, where things live.
    proc = Proc(everycycle("serve", "--port", str(port), "--threads", "2", "--settings", str(settings_path),
                           "--model-store", str(store.root), "--run-dir", str(run)), tmp_path / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 120, "the server", proc)
        info = EngineClient(str(run / "engine.sock")).info(timeout=5.0)
        assert (info.n_ctx, info.n_parallel) == (512, 2)
        assert (info.placement["cache_type_k"], info.placement["cache_type_v"]) == ("q8_0", "q8_0")
        rows = {m["id"]: m for m in json.loads(http_get(base + "/v1/models")[1])["data"]}
        assert set(rows) == {"agent", "gpt-4o-mini", "tiny", MODEL_ID}, rows  # patterns are not names to list
        assert rows["gpt-4o-mini"]["context_length"] == 512
        assert rows["tiny"]["context_length"] == rows["agent"]["context_length"] == 256  # what it will be served at
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        # An alias of the default model is answered by it; one of a store model loads that model. Each answers
        # under the name asked for.
        assert client.completions.create(model="gpt-4o-mini", prompt="Hi", max_tokens=2).model == "gpt-4o-mini"
        # A pattern covers every name Claude Code sends; the Messages API answers under the name asked for.
        import anthropic

        said = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0).messages.create(
            model="claude-sonnet-5", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
        assert said.model == "claude-sonnet-5" and said.usage.output_tokens >= 1
        assert json.loads(http_get(base + "/v1/models/tiny")[1])["state"] == "available"
        asked_at = time.monotonic()  # the pool counts idle time from a request's start
        assert client.chat.completions.create(model="agent", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2).model == "agent"
        assert json.loads(http_get(base + "/v1/models/tiny")[1])["state"] == "loaded"
        # "ti*" matches "tiny", but a model's own name is never taken by a pattern.
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).model == "tiny"
        own = EngineClient(str(run / "engine-tiny.sock")).info(timeout=5.0)
        assert (own.n_ctx, own.n_parallel) == (256, 1)
        # keep_alive "2s" (serve's default is 5 minutes): the store model goes once idle that long.
        wait_for(lambda: 'everycycle_model_unloads_total{model="tiny",reason="keep_alive"} 1.0'
                 in http_get(base + "/metrics")[1].decode(), 60, "the keep-alive unload", proc)
        assert time.monotonic() - asked_at >= 2.0
        assert json.loads(http_get(base + "/v1/models/tiny")[1])["state"] == "available"
    finally:
        proc.stop()


def test_a_models_own_settings_win_over_the_box_s_and_an_explicit_option_over_both(tmp_path):
    settings = ServingSettings(context_length=4096, parallel=4, speculation="ngram")
    own = ModelSettings(context_length=1024, speculation="off").serve_options()
    args = serve_arguments(build_parser().parse_args(["serve"]), settings, own)
    assert (args.ctx_size, args.parallel, args.speculation) == (1024, 4, "off")
    args = serve_arguments(build_parser().parse_args(["serve", "--ctx-size", "2048"]), settings, own)
    assert (args.ctx_size, args.parallel, args.explicit) == (2048, 4, {"ctx_size"})
    options = engine_options(build_parser(), args, None).with_serving(**own)
    assert (options.context.n_ctx_per_seq, options.speculation.enabled, options.context.speculation) == \
        (1024, False, False)


def _models(tmp_path, *argv: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "host_runtime.cli", "models", "--store", str(tmp_path / "store"),
                           *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "EVERYCYCLE_RUN_DIR": str(tmp_path / "run"), **(env or {})})


def _store_with(tmp_path, *names: str) -> Store:
    store = Store(tmp_path / "store")
    store.root.mkdir(parents=True, exist_ok=True)
    for name in names:
        f = write_tiny_llama(tmp_path / f"{name}.gguf", n_ctx=256)
        store.admit(f, name, "0" * 64, str(f), move=True)
    return store


def test_models_set_keeps_a_models_own_settings_in_the_store(tmp_path):
    store = _store_with(tmp_path, "tiny")
    done = _models(tmp_path, "set", "tiny", "--ctx-size", "512", "--speculation", "ngram")
    assert done.returncode == 0 and "context_length 512, speculation ngram" in done.stdout, done.stderr
    assert store.settings_of("tiny") == ModelSettings(context_length=512, speculation="ngram")
    shown = json.loads(_models(tmp_path, "show", "tiny", "--json").stdout)
    assert shown["settings"] == {"context_length": 512, "speculation": "ngram"}
    # serving.toml's rules, not looser ones of their own (#57: a model took a 1-15 MiB KV budget and a 128-token
    # context that serving.toml refuses)
    for option, value, words in (("--kv-budget-mib", "8", "between 16 and"), ("--ctx-size", "128", "between 256 and")):
        bad = _models(tmp_path, "set", "tiny", option, value)
        assert bad.returncode == 1 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bad = _models(tmp_path, "set", "tiny", "--parallel", "-2")
    assert bad.returncode == 1 and "--parallel: must be between" in bad.stderr and "Traceback" not in bad.stderr
    assert store.settings_of("tiny").parallel == 0  # nothing half-applied
    assert _models(tmp_path, "set", "tiny", "--clear").returncode == 0
    assert not (store.root / "tiny" / "settings.toml").exists()
    missing = _models(tmp_path, "set", "nope", "--parallel", "2")
    assert missing.returncode == 1 and "no model named 'nope'" in missing.stderr


def test_models_default_changes_the_served_model_in_serving_toml_and_keeps_the_rest(tmp_path):
    from host_runtime.common.settings_file import save

    store = _store_with(tmp_path, "tiny")
    path = tmp_path / "etc" / "serving.toml"
    path.parent.mkdir()
    save(ServingSettings(parallel=3, aliases={"agent": "tiny"}, pull_url="http://10.0.0.2/tiny.gguf",
                         pull_sha256="a" * 64, pull_name="tiny"), path)
    done = _models(tmp_path, "default", "tiny", env={"EVERYCYCLE_STATE_DIR": str(tmp_path / "etc")})
    assert done.returncode == 0, done.stderr
    assert "served from the serving service's next start" in done.stdout  # no supervisord here to restart it
    settings = load(ServingSettings, path)
    assert settings.model == str(store.path_of(store.get("tiny")).resolve())
    assert (settings.parallel, settings.aliases, settings.pull_url) == (3, {"agent": "tiny"}, "")
    # What the serve process then starts with: the store's model, by its own parser.
    assert _as_serve_reads_it(path).model is None and settings.model.endswith("tiny.gguf")
    assert _models(tmp_path, "default", "--built-in", "--settings", str(path)).returncode == 0
    assert load(ServingSettings, path).model == ""
    again = _models(tmp_path, "default", "--built-in", "--settings", str(path))
    assert "already the default" in again.stdout
    for argv, said in ((["default", "nope", "--settings", str(path)], "no model named 'nope'"),
                       (["default", "--settings", str(path)], "give a model's NAME or --built-in")):
        refused = _models(tmp_path, *argv)
        assert refused.returncode != 0 and said in refused.stderr and "Traceback" not in refused.stderr
    assert load(ServingSettings, path).model == ""


def test_models_default_waits_for_the_bundles_pull(tmp_path):
    from host_runtime.common.settings_file import save

    _store_with(tmp_path, "tiny")
    path = tmp_path / "serving.toml"
    pulling = ServingSettings(pull_url="http://10.0.0.2/big.gguf", pull_sha256="b" * 64, pull_name="big")
    save(pulling, path)
    refused = _models(tmp_path, "default", "tiny", "--settings", str(path))
    assert refused.returncode == 1 and "big is still being pulled" in refused.stderr
    assert load(ServingSettings, path) == pulling


def test_each_serving_setting_is_said_once_and_makes_its_flag_box_tomls_field_and_serving_tomls_rule(capsys):
    """#57: a setting lived in six shapes whose rules and defaults drifted (a 1-15 MiB KV budget one took and
    another refused; a default context of 4096 in one and 32768 in another). Each is now declared once
    (serving/settings.py) and the flag, box.toml's [serving] field and the reader are made from that."""
    from host_runtime.common.setting_rules import SettingsError, tunables
    from host_runtime.engine.model import ContextConfig
    from provisioning.box_model import Serving

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    serve_help = " ".join(capsys.readouterr().out.split())
    declared = tunables(ServingSettings)
    assert {t.name for t in declared} == set(Serving.model_fields)
    for t in declared:
        assert Serving.model_fields[t.name].description.startswith(t.described)
        if t.flag:  # the flag's help is the same words (argparse wraps them)
            assert " ".join(t.described.split()) in serve_help, t.name
    # What a flag refuses, serving.toml refuses in the same words
    for name, flag, bad in (("context_length", "--ctx-size", 128), ("kv_budget_mib", "--kv-budget-mib", 8),
                            ("keep_alive", "--keep-alive", "5x")):
        with pytest.raises(SettingsError) as refused:
            ServingSettings(**{name: bad})
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", flag, str(bad)])
        assert f"argument {flag}: {refused.value.message}" in capsys.readouterr().err
    # One default: the engine's own and serve's are the same values
    defaults = {t.name: t.default for t in declared}
    assert ContextConfig().n_ctx_per_seq == defaults["context_length"] == DEFAULT_CTX
    assert ContextConfig().kv_budget_bytes == defaults["kv_budget_mib"] << 20
    assert (ContextConfig().cache_type_k, ContextConfig().cache_type_v) == (defaults["cache_type_k"],
                                                                            defaults["cache_type_v"])
    assert re.fullmatch(r"\d+m", defaults["keep_alive"]) and int(defaults["keep_alive"][:-1]) * 60 == KEEP_ALIVE_S
