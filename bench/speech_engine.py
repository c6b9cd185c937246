#!/usr/bin/env python3
"""One speech engine's figures for bench/speech.py (prints one JSON line): a random-weight Whisper of a real shape
loaded, then 30 s of sound transcribed with the decoder held to 1 token (the window's encode, nearly all of it)
and to 100 tokens (a spoken half-minute's transcript is about that long), greedy, no temperature fallback.
Run under the Python that has the engine: whisper.cpp (pywhispercpp, this project's venv) or faster-whisper
(CTranslate2; a venv of its own with torch and transformers, which write its random model).

  speech_engine.py --engine whisper.cpp|faster-whisper --size base|small --cache DIR [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"tiny": (384, 6, 4), "base": (512, 8, 6), "small": (768, 12, 12)}
WINDOW_S = 30.0
TOKENS = 100


def sound(seconds: float = WINDOW_S, rate: int = 16000) -> np.ndarray:
    """A warbling tone under noise: the encoder's cost is the window's, whatever the sound."""
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.2 * np.sin(2 * np.pi * 300 * t) * np.sin(2 * np.pi * 0.5 * t)
    return (tone + np.random.default_rng(0).normal(0, 0.02, t.size)).astype(np.float32)


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def whisper_cpp(size: str, cache: Path, threads: int):
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_whisper import write_whisper
    import _pywhispercpp as pw
    from pywhispercpp.model import Model

    path = cache / f"whisper-cpp-{size}.bin"
    if not path.exists():
        write_whisper(path, size)
    before = rss_mib()
    started = time.perf_counter()
    model = Model(str(path), n_threads=threads, print_progress=False, redirect_whispercpp_logs_to=None)
    load_s, resident = time.perf_counter() - started, rss_mib() - before

    def run(tokens: int) -> int:
        model.transcribe(sound(), max_tokens=tokens, single_segment=True, no_timestamps=True, temperature=0.0,
                         temperature_inc=0.0)
        ctx = model._ctx
        return sum(pw.whisper_full_n_tokens(ctx, i) for i in range(pw.whisper_full_n_segments(ctx)))

    return load_s, resident, run


def faster_whisper(size: str, cache: Path, threads: int):
    from faster_whisper import WhisperModel

    folder = cache / f"faster-whisper-{size}"
    if not (folder / "model.bin").exists():
        _write_ct2(folder, size)
    before = rss_mib()
    started = time.perf_counter()
    model = WhisperModel(str(folder), device="cpu", compute_type="float32", cpu_threads=threads)
    load_s, resident = time.perf_counter() - started, rss_mib() - before

    def run(tokens: int) -> int:
        # End-of-text and timestamp tokens suppressed: a random model's timestamp otherwise moves faster-whisper's
        # window every few tokens (five encodes of one 30 s sound, measured), which no trained model does.
        segments, _ = model.transcribe(sound(), language="en", beam_size=1, temperature=0.0, max_new_tokens=tokens,
                                       without_timestamps=True, condition_on_previous_text=False, vad_filter=False,
                                       suppress_tokens=[-1, 50257, *range(50358, 51865)])
        return sum(len(s.tokens) for s in segments)

    return load_s, resident, run


def _write_ct2(folder: Path, size: str) -> None:
    """A random transformers Whisper of the shape, converted by CTranslate2, with a vocabulary whose special
    tokens sit where Whisper's do (faster-whisper finds them by name)."""
    import torch
    from ctranslate2.converters import TransformersConverter
    from faster_whisper.tokenizer import _LANGUAGE_CODES
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(0)
    width, heads, layers = SHAPES[size]
    config = WhisperConfig(vocab_size=51865, d_model=width, encoder_attention_heads=heads,
                           decoder_attention_heads=heads, encoder_layers=layers, decoder_layers=layers,
                           encoder_ffn_dim=4 * width, decoder_ffn_dim=4 * width, num_mel_bins=80,
                           max_source_positions=1500, max_target_positions=448)
    hf = folder.with_name(folder.name + "-hf")
    WhisperForConditionalGeneration(config).save_pretrained(hf)
    TransformersConverter(str(hf)).convert(str(folder), force=True)
    vocab = {(chr(33 + i) if i < 94 else f"w{i}"): i for i in range(50257)}
    specials = (["<|endoftext|>", "<|startoftranscript|>"] + [f"<|{c}|>" for c in _LANGUAGE_CODES if c != "yue"]
                + ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
                   "<|notimestamps|>"] + [f"<|{i * 0.02:.2f}|>" for i in range(1501)])
    for s in specials:
        vocab[s] = len(vocab)
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens([AddedToken(s, special=True) for s in specials])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "vocabulary.json").write_text(json.dumps(sorted(vocab, key=vocab.get)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=("whisper.cpp", "faster-whisper"), required=True)
    p.add_argument("--size", choices=tuple(SHAPES), required=True)
    p.add_argument("--cache", type=Path, required=True)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    load = whisper_cpp if args.engine == "whisper.cpp" else faster_whisper
    load_s, resident, run = load(args.size, args.cache, args.threads)
    run(1)  # warm-up
    started = time.perf_counter()
    run(1)
    encode_s = time.perf_counter() - started
    started = time.perf_counter()
    tokens = run(TOKENS)
    decoded_s = time.perf_counter() - started
    per_token = (decoded_s - encode_s) / max(tokens - 1, 1)
    print(json.dumps({"engine": args.engine, "size": args.size, "threads": args.threads, "load_s": round(load_s, 3),
                      "resident_mib": round(resident, 1), "encode_30s_s": round(encode_s, 3),
                      "tokens_decoded": tokens, "decode_s_per_token": round(per_token, 5),
                      f"rtf_at_{TOKENS}_tokens": round((encode_s + TOKENS * per_token) / WINDOW_S, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
