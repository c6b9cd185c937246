"""The model store: pulls from a test-made HTTP server on 127.0.0.1 (and a local Hugging Face endpoint) with
progress, resume, sha256 and GGUF checks; add, list, show, pin, rm; nothing half-pulled ever listed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from host_runtime.models.errors import StoreError
from host_runtime.models.manifest import Manifest, check_name, name_for_file
from host_runtime.models.store import Store
from tests.file_server import Files
from tests.servers import everycycle, wait_for
from tests.tiny_gguf import write_tiny_llama

# ---- pure ------------------------------------------------------------------------------------------------------

def test_names():
    assert name_for_file("SmolLM2-135M-Instruct.Q4_1.gguf") == "SmolLM2-135M-Instruct.Q4_1"
    assert name_for_file("my model (v2).gguf") == "my-model--v2-"
    assert check_name("qwen2.5-7b_q4") == "qwen2.5-7b_q4"
    for bad in ("", ".hidden", "a/b", "x" * 129, "a.partial"):
        with pytest.raises(StoreError):
            check_name(bad)


def test_a_manifest_round_trips_and_a_damaged_one_is_refused():
    m = Manifest("m", "m.gguf", "ab" * 32, 10, "llama", "Q4_1", 2048, True, "http://x/m.gguf", "2026-12-01T00:00:00+00:00")
    assert Manifest.from_json(m.to_json()) == m
    with pytest.raises(StoreError):
        Manifest.from_json('{"name": "m"}')


def test_a_disk_that_cannot_hold_the_model_is_refused_before_writing(tmp_path):
    with pytest.raises(StoreError, match="GiB free"):
        Store(tmp_path).check_room(1 << 60, "huge")


# ---- against real servers ----------------------------------------------------------------------------------------

@pytest.fixture
def served(tmp_path):
    files = tmp_path / "files"
    files.mkdir()
    model = write_tiny_llama(files / "tiny.gguf", n_ctx=256, n_embd=256, n_layer=4, n_ff=512)
    (files / "notes.gguf").write_text("this is not a model\n" * 100)
    server = Files(files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server, model, hashlib.sha256(model.read_bytes()).hexdigest(), tmp_path / "store"
    finally:
        server.shutdown()


def models(store: Path, *args: str, env: dict | None = None, timeout: float = 120):
    return subprocess.run(everycycle("models", "--store", str(store), *args), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def listed(store: Path) -> list[dict]:
    out = models(store, "list", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.system
def test_a_pull_from_the_lan_shows_progress_checks_its_hash_and_lists_the_model(served):
    server, model, sha, store = served
    out = models(store, "pull", server.base + "/tiny.gguf", "--sha256", sha)
    assert out.returncode == 0, out.stderr
    assert re.search(r"pulling tiny: [\d.,]+ MiB of [\d.,]+ MiB \(100%\), \d+ s left, [\d.,]+ MiB/s", out.stderr)
    (entry,) = listed(store)
    assert (entry["name"], entry["sha256"], entry["architecture"], entry["quantization"], entry["context_length"],
            entry["source"]) == ("tiny", sha, "llama", "ALL_F32", 256, server.base + "/tiny.gguf")
    assert (store / "tiny" / "tiny.gguf").read_bytes() == model.read_bytes()
    assert not list((store / ".partial").iterdir())
    again = models(store, "pull", server.base + "/tiny.gguf")
    assert again.returncode == 1 and "already in the store" in again.stderr


@pytest.mark.system
def test_a_pull_killed_halfway_resumes_and_ends_with_the_same_hash(served):
    server, model, sha, store = served
    server.delay_s = 0.05  # about 2 s for the whole file
    proc = subprocess.Popen(everycycle("models", "--store", str(store), "pull", server.base + "/tiny.gguf"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    part = store / ".partial" / "tiny.gguf.part"
    wait_for(lambda: part.exists() and part.stat().st_size > 2 << 20, 30, "half the download")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert 0 < part.stat().st_size < model.stat().st_size and listed(store) == []
    server.delay_s = 0.0
    out = models(store, "pull", server.base + "/tiny.gguf", "--sha256", sha)
    assert out.returncode == 0, out.stderr
    assert "resuming tiny at" in out.stderr and server.ranges[-1].startswith("bytes=") and server.ranges[-1] != "bytes=0-"
    assert [e["sha256"] for e in listed(store)] == [sha]


@pytest.mark.system
def test_a_wrong_hash_or_a_body_that_is_not_a_gguf_is_refused_and_nothing_is_listed(served):
    server, _, sha, store = served
    out = models(store, "pull", server.base + "/tiny.gguf", "--sha256", "0" * 64)
    assert out.returncode == 1 and "is not the 000" in out.stderr and "Traceback" not in out.stderr
    out = models(store, "pull", server.base + "/notes.gguf")
    assert out.returncode == 1 and "not a GGUF file" in out.stderr
    out = models(store, "pull", server.base + "/missing.gguf")
    assert out.returncode == 1 and "HTTP 404" in out.stderr
    out = models(store, "pull", "ftp://example/x.gguf")
    assert out.returncode == 1 and "SOURCE" in out.stderr
    assert listed(store) == [] and not list((store / ".partial").iterdir())


@pytest.mark.system
def test_a_hugging_face_source_goes_through_huggingface_hub_to_a_local_endpoint(served):
    server, _, sha, store = served
    out = models(store, "pull", "hf://someone/tiny-models/tiny.gguf", "--name", "tiny-hf",
                 env={"HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"})
    assert out.returncode == 0, out.stderr
    # huggingface_hub's progress reaches our own lines (its tqdm_class), as an http pull's do
    assert re.search(r"pulling tiny-hf: [\d.,]+ MiB of [\d.,]+ MiB \(100%\)", out.stderr), out.stderr
    (entry,) = listed(store)
    assert (entry["name"], entry["sha256"], entry["source"]) == ("tiny-hf", sha, "hf://someone/tiny-models/tiny.gguf")


@pytest.mark.system
def test_a_repository_and_a_quantization_name_the_file_and_bring_its_projector(tmp_path):
    """hf://OWNER/REPO:QUANT (#59, #58): the repository's listing (the Hub's tree API, at HF_ENDPOINT) names the
    file of that quantization and its projector; both are pulled, checked against the listing's sha256, and the
    projector kept beside the model. A quantization the repository does not have is refused, naming those it has."""
    import shutil

    from tests.tiny_gguf import write_vision_pair

    text, projector = write_vision_pair(tmp_path / "made")
    repo = tmp_path / "repo"
    repo.mkdir()
    for quant in ("Q8_0", "F16"):
        shutil.copy(text, repo / f"tiny-vision-{quant}.gguf")
    shutil.copy(projector, repo / "mmproj-tiny-vision-f16.gguf")
    (repo / "README.md").write_text("a model card\n")
    server = Files(repo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    store = tmp_path / "store"
    env = {"HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        out = models(store, "pull", "hf://someone/tiny-vision:q8_0", env=env)
        assert out.returncode == 0, out.stderr
        assert "hf://someone/tiny-vision/tiny-vision-Q8_0.gguf, with the projector" in out.stderr
        (entry,) = listed(store)
        assert (entry["name"], entry["source"], entry["projector"]) == (
            "tiny-vision-q8_0", "hf://someone/tiny-vision/tiny-vision-Q8_0.gguf", "mmproj.gguf")
        assert (store / "tiny-vision-q8_0" / "mmproj.gguf").read_bytes() == projector.read_bytes()
        assert entry["projector_takes"] == "vision"
        out = models(store, "pull", "hf://someone/tiny-vision:Q2_K", env=env)
        assert out.returncode == 1 and "has no GGUF quantized Q2_K (it has F16, Q8_0)" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and len(listed(store)) == 1
    finally:
        server.shutdown()


@pytest.mark.system
def test_a_quantization_split_into_parts_is_planned_from_every_parts_header_and_pulled_whole(tmp_path):
    """#59: hf://OWNER/REPO:QUANT where the repository splits that quantization (FILE-00001-of-0000N.gguf, as the
    Hub's large GGUFs are): the verdict reads each part's header (a range request each; the later parts hold their
    own tensors' table), every part is pulled with one progress and checked against the listing's sha256, and the
    store keeps the set; a repository lacking a part is refused before anything is downloaded."""
    from tests.file_server import serve_files

    repo = tmp_path / "repo"
    repo.mkdir()
    write_tiny_llama(repo / "tiny-split-Q8_0.gguf", n_ctx=256, n_layer=4, split_max_tensors=12)
    write_tiny_llama(repo / "tiny-split-F16.gguf", n_ctx=256, n_layer=4, split_max_tensors=20)
    (repo / "tiny-split-F16-00002-of-00002.gguf").unlink()
    server = serve_files(repo)
    store = tmp_path / "store"
    env = {"HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        out = models(store, "pull", "hf://someone/tiny-split:Q8_0", env=env)
        lacking = models(store, "pull", "hf://someone/tiny-split:F16", env=env)
        header_reads = [(path, r) for r, path in zip(server.ranges, [p for p in server.paths if "/resolve/" in p])
                        if re.fullmatch(r"bytes=0-\d+", r or "")]
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert "tiny-split-Q8_0-00001-of-00004.gguf and its 3 further parts" in out.stderr
    assert "in 4 parts) through huggingface_hub" in out.stderr and "; fits: 256-token context" in out.stderr
    assert sorted(path.rsplit("/", 1)[1] for path, _ in header_reads if "Q8_0" in path) == [
        f"tiny-split-Q8_0-{k:05d}-of-00004.gguf" for k in range(1, 5)]
    (entry,) = listed(store)
    assert entry["name"] == "tiny-split-Q8_0" and entry["size"] == sum(
        f.stat().st_size for f in repo.glob("tiny-split-Q8_0-*.gguf"))
    kept = sorted(p.name for p in (store / "tiny-split-Q8_0").glob("*.gguf"))
    assert kept == [f"tiny-split-Q8_0-{k:05d}-of-00004.gguf" for k in range(1, 5)]
    for k, name in enumerate(kept, start=1):
        original = repo / f"tiny-split-Q8_0-{k:05d}-of-00004.gguf"
        assert (store / "tiny-split-Q8_0" / name).read_bytes() == original.read_bytes()
    assert [p["sha256"] for p in entry["parts"]] == [
        hashlib.sha256((repo / n).read_bytes()).hexdigest() for n in kept[1:]]
    assert lacking.returncode == 1 and "lacks tiny-split-F16-00002-of-00002.gguf" in lacking.stderr, lacking.stderr
    assert "Traceback" not in lacking.stderr and len(listed(store)) == 1


@pytest.mark.system
def test_add_show_pin_and_rm(served):
    _, model, sha, store = served
    out = models(store, "add", str(model), "--name", "local-tiny")
    assert out.returncode == 0, out.stderr
    shown = json.loads(models(store, "show", "local-tiny", "--json").stdout)
    assert shown["sha256"] == sha and Path(shown["path"]).is_file()
    assert json.loads(models(store, "pin", "local-tiny", "--json").stdout)["pinned"] is True
    out = models(store, "rm", "local-tiny")
    assert out.returncode == 1 and "pinned" in out.stderr
    assert models(store, "rm", "local-tiny", "--force").returncode == 0
    assert listed(store) == [] and not (store / "local-tiny").exists()
    out = models(store, "show", "nope")
    assert out.returncode == 1 and "no model named 'nope'" in out.stderr


def test_a_manifest_naming_another_folder_is_not_trusted_and_rm_touches_nothing_outside_the_store(tmp_path):
    """The serving user can write a manifest; root's `models rm` acted on its name (#56, item 14: a planted "../x"
    deleted a folder outside the store, and where that held no manifest, rm died with a traceback)."""
    import json

    from tests.tiny_gguf import write_tiny_llama

    store = tmp_path / "store"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "manifest.json").write_text("{}")
    (victim / "keep.txt").write_text("the owner's")
    for name in ("x", "y"):
        assert models(store, "add", "--name", name, str(write_tiny_llama(tmp_path / f"{name}.gguf"))).returncode == 0
    for name, change in (("x", {"name": "../victim"}), ("y", {"file": "../../victim/keep.txt"})):
        path = store / name / "manifest.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
        out = models(store, "rm", name)
        assert out.returncode != 0 and "not trusted" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert (victim / "keep.txt").read_text() == "the owner's" and (victim / "manifest.json").exists()
    assert "x" not in models(store, "list").stdout.split()


@pytest.mark.system
def test_a_quantization_that_does_not_fit_is_refused_before_its_download(tmp_path):
    """#59: `models pull hf://OWNER/REPO:QUANT` reads the chosen file's header first (a range request) and asks the
    planner: a 63 GB gpt-oss-120b table (sparse: the real size, holes for weights) does not fit this machine and is
    refused naming why, with nothing downloaded or kept; a small quantization of the same repository says it fits
    and is pulled; --no-fit-check skips the question."""
    from tests.file_server import serve_files
    from tests.sparse_gguf import gpt_oss_120b

    repo = tmp_path / "repo"
    repo.mkdir()
    gpt_oss_120b(repo / "big-model-MXFP4.gguf")
    write_tiny_llama(repo / "big-model-Q8_0.gguf", n_ctx=256)
    server = serve_files(repo)
    store = tmp_path / "store"
    env = {"HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    try:
        out = models(store, "pull", "hf://someone/big-model:MXFP4", env=env)
        assert out.returncode == 1 and "does not fit this box, so nothing was downloaded" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and listed(store) == []
        assert not any(p.is_file() for p in (store / ".partial").rglob("*"))
        big_reads = [r for r, path in zip(server.ranges, [p for p in server.paths if "/resolve/" in p])
                     if "MXFP4" in path]
        assert big_reads and all(re.fullmatch(r"bytes=0-\d+", r or "") for r in big_reads), big_reads
        assert max(int(r.rsplit("-", 1)[1]) for r in big_reads) < 64 << 20  # the header's megabytes, no more
        out = models(store, "pull", "hf://someone/big-model:Q8_0", env=env)
        assert out.returncode == 0 and "; fits: " in out.stderr, out.stderr
        out = models(store, "pull", "hf://someone/big-model:Q8_0", "--no-fit-check", "--name", "unasked", env=env)
        assert out.returncode == 0 and "fits" not in out.stderr, out.stderr
    finally:
        server.shutdown()
    assert sorted(m["name"] for m in listed(store)) == ["big-model-Q8_0", "unasked"]


def test_a_repositorys_files_group_by_quantization_and_a_size_says_a_first_word_on_fitting():
    from host_runtime.models.hub_search import by_size, quantizations

    got = quantizations("o/r", [("r-Q8_0.gguf", 800), ("sub/r-Q4_K_M.gguf", 500), ("mmproj-r-f16.gguf", 90),
                                ("r-F16-00001-of-00002.gguf", 1000), ("r-F16-00002-of-00002.gguf", 900),
                                ("README.md", 5), ("r.gguf", 7)])
    assert [(q.quant, q.size_bytes, q.parts, q.projector) for q in got] == [
        ("Q4_K_M", 500, 1, True), ("Q8_0", 800, 1, True), ("F16", 1900, 2, True)]
    assert got[0].source == "hf://o/r:Q4_K_M"
    assert [by_size(size, 1000) for size in (800, 950, 1200)] == ["likely fits", "tight", "too big"]


@pytest.mark.system
def test_search_lists_the_hubs_gguf_repositories_with_each_quantizations_size_fit_and_pull_name(tmp_path):
    """#59: `models search TEXT` asks the Hub (here a loopback one at HF_ENDPOINT) for GGUF repositories, lists each
    quantization with its size, a first word on fitting from that size, and the name that pulls it."""
    from tests.file_server import serve_files
    from tests.sparse_gguf import gpt_oss_120b

    repo = tmp_path / "repo"
    repo.mkdir()
    gpt_oss_120b(repo / "big-model-MXFP4.gguf")
    write_tiny_llama(repo / "big-model-Q8_0.gguf", n_ctx=256)
    server = serve_files(repo)
    server.models = [{"id": "someone/big-model", "downloads": 10, "likes": 1, "tags": ["gguf"]},
                     {"id": "someone/unrelated", "downloads": 5, "likes": 0, "tags": ["gguf"]}]
    env = {"HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    own = tmp_path / "catalog.toml"  # the owner's catalog entry for the same repository: --fit picks the quant
    own.write_text('[[model]]\nname = "big"\ntag = "1"\nrepo = "someone/big-model"\nquants = ["MXFP4", "Q8_0"]\n'
                   'size_gb = 63.0\ncontext = 256\ncan = ["tools"]\nlicense = "test"\nwhy = "a quantization too big and one not"\n')
    try:
        out = models(tmp_path / "store", "search", "big", env=env)
        shown = models(tmp_path / "store", "search", "big", "--json", env=env)
        none = models(tmp_path / "store", "search", "nothing-like-it", env=env)
        fits = models(tmp_path / "store", "catalog", "--fit", "--json", env={**env, "EVERYCYCLE_CATALOG": str(own)})
        # a catalog name pulls: its default quantization (MXFP4) refused as too big, the one its tag asks pulled
        too_big = models(tmp_path / "store", "pull", "big:1", env={**env, "EVERYCYCLE_CATALOG": str(own)})
        pulled = models(tmp_path / "store", "pull", "big:1-q8_0", env={**env, "EVERYCYCLE_CATALOG": str(own)})
    finally:
        server.shutdown()
    assert fits.returncode == 0, fits.stderr
    best = {e["name"]: e["fits_best"] for e in json.loads(fits.stdout)}["big:1"]
    assert best.startswith("Q8_0 (") and best.endswith("hf://someone/big-model:Q8_0"), best
    assert too_big.returncode == 1 and "big:1: hf://someone/big-model:MXFP4" in too_big.stderr
    assert "does not fit this box" in too_big.stderr
    assert pulled.returncode == 0, pulled.stderr
    assert [m["name"] for m in listed(tmp_path / "store")] == ["big-1"]
    assert out.returncode == 0, out.stderr
    assert "someone/big-model" in out.stdout and "unrelated" not in out.stdout
    assert re.search(r"Q8_0 +[\d.]+ MiB +likely fits +everycycle models pull hf://someone/big-model:Q8_0", out.stdout)
    assert re.search(r"MXFP4 +5\d\.\d GiB +too big", out.stdout), out.stdout
    (found,) = json.loads(shown.stdout)
    assert [q["quantization"] for q in found["quantizations"]] == ["Q8_0", "MXFP4"]
    assert any("search=big" in p and "filter=gguf" in p for p in server.paths), server.paths
    assert none.returncode == 0 and "no GGUF repositories match 'nothing-like-it'" in none.stdout
