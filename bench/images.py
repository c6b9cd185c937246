#!/usr/bin/env python3
"""What an image costs the first time and again (prints JSON): a server with a model and its projector (by default
the tests' random-weight text model with a random-weight gemma3 projector, 16 places per 64x64 image), then, per
repeat, a chat completion with a new image and the same request again. Reported: each request's time to its
first token, the prompt tokens and those the prefix cache supplied, the second's TTFT as a ratio to the first's
(median and spread over the repeats), and libmtmd's own encode time per image from the server's log. The tiny
projector's encode time says nothing of a real one's (a SigLIP of 400M parameters at 896x896); the cache's share
of a repeated image's prompt does.

  bench/images.py [--model PATH --mmproj PATH] [--repeats 5] [--size 64] [--threads N]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cpu_flags() -> list[str]:
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    have = set(flags.split(":", 1)[1].split())
    return [f for f in ("avx", "avx2", "fma", "f16c", "avx512f", "amx_tile") if f in have]


def ask(client, model: str, image: bytes) -> tuple[float, object]:
    url = "data:image/png;base64," + base64.b64encode(image).decode()
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, max_tokens=4, temperature=0, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"},
                                               {"type": "image_url", "image_url": {"url": url}}]}])
    first, usage = None, None
    for event in stream:
        if first is None and event.choices and event.choices[0].delta.content:
            first = time.perf_counter() - started
        usage = event.usage or usage
    return first if first is not None else time.perf_counter() - started, usage


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--mmproj")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--size", type=int, default=64, help="the images' width and height")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = p.parse_args()

    import openai

    from tests.servers import Proc, everycycle, free_port, ready, wait_for
    from tests.tiny_gguf import png, write_vision_pair

    work = Path(tempfile.mkdtemp(prefix="bench-images-"))
    model, projector = (args.model, args.mmproj) if args.model else write_vision_pair(work)
    name = Path(model).name.removesuffix(".gguf")
    port = free_port()
    log = work / "serve.log"
    proc = Proc(everycycle("serve", "--port", str(port), "--model", str(model), "--mmproj", str(projector),
                           "--threads", str(args.threads), "--workers", "1", "--parallel", "2", "--ctx-size", "2048",
                           "--run-dir", str(work)), log)
    rows = []
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: ready(base), 300, "the server", proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        ask(client, name, png(args.size, args.size, (1, 2, 3)))  # the first request's own costs, not an image's
        for i in range(args.repeats):
            image = png(args.size, args.size, lambda x, y, i=i: ((x * 7 + i * 31) % 256, (y * 5) % 256, i * 40 % 256))
            first_s, first = ask(client, name, image)
            again_s, again = ask(client, name, image)
            rows.append({"first_ttft_s": round(first_s, 4), "again_ttft_s": round(again_s, 4),
                         "prompt_tokens": first.prompt_tokens,
                         "cached_first": first.prompt_tokens_details.cached_tokens,
                         "cached_again": again.prompt_tokens_details.cached_tokens})
    finally:
        proc.stop()
    encode_ms = [float(m) for m in re.findall(r"image slice encoded in (\d+) ms", log.read_text(errors="replace"))]
    ratios = [r["again_ttft_s"] / r["first_ttft_s"] for r in rows]
    print(json.dumps({
        "config": {"model": Path(model).name, "mmproj": Path(projector).name, "image_size": args.size,
                   "repeats": args.repeats, "threads": args.threads, "cpu_flags": cpu_flags()},
        "requests": rows,
        "again_vs_first_ttft": {"median": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                                "max": round(max(ratios), 3), "n": len(ratios)},
        "cached_share_again": round(statistics.median(r["cached_again"] / r["prompt_tokens"] for r in rows), 3),
        "encode_ms": {"median": statistics.median(encode_ms) if encode_ms else None, "n": len(encode_ms)},
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
