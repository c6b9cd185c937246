"""The option types and option groups several subcommands share, and the CLI's defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from host_runtime.common import run_layout
from host_runtime.engine.limits import DEFAULT_CTX


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return value


def _host_port(text: str) -> str:
    from host_runtime.common.host_port import split_host_port

    try:
        split_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    return parse


_positive = _int_at_least(1)
_non_negative = _int_at_least(0)


def _keep_alive(text: str) -> float | None:
    from host_runtime.pool.residency import parse_keep_alive

    try:
        return parse_keep_alive(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _positive_float(text: str) -> float:
    value = _number(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _draft_max(text: str) -> int:
    value = _positive(text)
    if value > 15:  # a step holds 16 decode tokens: the pending one and up to 15 drafted
        raise argparse.ArgumentTypeError(f"must be at most 15, got {value}")
    return value


def _probability_below_one(text: str) -> float:
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def _run_dir(explicit: str | None = None) -> Path:
    """Where the services publish (common/run_layout.py)."""
    return run_layout.run_dir(explicit)


DEFAULT_KV_BUDGET_MIB = 1024
DEFAULT_CACHE_TYPE = "f16"
DEFAULT_KEEP_ALIVE_S = 300.0
_UNSET = object()  # an option's default where None is a value (--keep-alive -1: forever)


def _add_cache_types(p: argparse.ArgumentParser) -> None:
    from host_runtime.placement.kv_types import KV_TYPES

    for which in ("k", "v"):
        p.add_argument(f"--cache-type-{which}", choices=list(KV_TYPES), metavar="TYPE",
                       help=f"the KV cache's {which.upper()} type, as llama-server names them ({', '.join(KV_TYPES)}; "
                            f"default {DEFAULT_CACHE_TYPE}); a quantized one turns flash attention on")


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=_non_negative, default=0, metavar="N", help="CPU threads for llama.cpp (0: all cores)")
    p.add_argument("--decode-threads", type=_non_negative, default=0, metavar="N",
                   help="CPU threads for a decode call of one token, a lone stream's step (0: as --threads)")
    p.add_argument("--ctx-size", type=_positive, metavar="N",
                   help="context tokens per sequence, at most the model's trained context (default: the trained "
                        f"context, up to {DEFAULT_CTX})")
    p.add_argument("--parallel", type=_positive, metavar="N",
                   help="sequences decoded together (default: as many as --kv-budget-mib holds at full context, up to 16)")
    p.add_argument("--kv-budget-mib", type=_positive, metavar="MIB",
                   help=f"memory for the KV cache of running sequences (default {DEFAULT_KV_BUDGET_MIB})")
    _add_cache_types(p)
    p.add_argument("--max-queue", type=_non_negative, metavar="N",
                   help="requests allowed to wait for a sequence before new ones get 503 (default 4 per sequence)")
    p.add_argument("--prefix-cache-ram-mib", type=_non_negative, default=1024, metavar="MIB",
                   help="host RAM for cached prompt prefixes moved out of the context (default 1024)")
    p.add_argument("--prefix-cache-disk-mib", type=_non_negative, default=4096, metavar="MIB",
                   help="disk space for cached prompt prefixes moved out of RAM (default 4096)")
    p.add_argument("--prefix-cache-dir", metavar="DIR",
                   help="where the disk tier lives (serve: RUN_DIR/prefix-cache; engine: no disk tier without it)")
    p.add_argument("--no-prefix-cache", action="store_true", help="recompute every prompt from scratch")
    p.add_argument("--mixed-batches", action="store_true",
                   help="prompt chunks and decode tokens in one llama_decode call over one shared KV buffer, as "
                        "llama-server batches; a request's output then depends on what else is batched (default: "
                        "batch-invariant, the faster of the two on CPU as measured by bench/serving.py)")
    p.add_argument("--speculation", choices=["ngram", "draft", "off"],
                   help="ngram: each decoding sequence drafts the tokens that followed the latest earlier occurrence "
                        "of its last few tokens (prompt lookup) and the model verifies them in the same call, so "
                        "edits and quotes come several tokens a step; drafts stop when a step holds 16 tokens or the "
                        "measured cost of calls says they would not pay (--draft-always). The "
                        "output is the one decoding without it gives (on the CPU in the default batching mode, "
                        "which then lays attention out for it: README). draft: a smaller model of the "
                        "same vocabulary (--draft-model) drafts its most likely tokens. off (default): one token a "
                        "step")
    p.add_argument("--draft-max", type=_draft_max, default=12, metavar="N",
                   help="the most tokens a sequence drafts in a step, 1 to 15; up to this, each sequence drafts "
                        "as many as its acceptance and the measured cost of calls say pay (default 12)")
    p.add_argument("--draft-always", action="store_true",
                   help="draft as much as acceptance earned and the step has room for, whatever the calls cost "
                        "(default: only as much as the measured cost of this box's decode calls says pays; on a "
                        "small CPU bound by computation that is often nothing)")
    p.add_argument("--draft-p-min", type=_probability_below_one, default=0.0, metavar="P",
                   help="with --speculation draft: the draft stops at a token the draft model gives less than P "
                        "(a likely rejection; default 0: never, as llama.cpp's default)")
    p.add_argument("--draft-model", metavar="PATH",
                   help="with --speculation draft: the GGUF that drafts for the served model (models loaded on "
                        "demand beside it run without); its tokens must be the target's (loaded after the target, "
                        "placed by the same planner, with as many sequences)")
    p.add_argument("--wedge-floor", type=_positive_float, default=30.0, metavar="S",
                   help="the engine counts as wedged when pending work sees no decode call complete for the larger "
                        "of this and 10x its expected call time, measured (default 30)")
    p.add_argument("--governor-state", metavar="PATH",
                   help="the power governor's state file: its throttle level lowers concurrency (default: none)")
    _add_placement_options(p)


def _tensor_split(text: str) -> str:
    """'3,1' (as llama-server takes it): checked here, kept as text so it passes to the engine unchanged."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as 3,1, got {text!r}") from None
    if any(v < 0 for v in values) or sum(values) <= 0:
        raise argparse.ArgumentTypeError(f"values must be non-negative with a positive sum, got {text!r}")
    return text


def _add_placement_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--placement", choices=["auto", "cpu"], default="auto",
                   help="auto (default): the planner spreads layers over the GPUs llama.cpp sees, proven to fit "
                        "before loading; cpu: keep everything on the CPU")
    p.add_argument("--gpu-layers", type=_non_negative, metavar="N",
                   help="offload exactly N layers (the output layer counts first), as llama-server's -ngl; "
                        "checked by the same proof")
    p.add_argument("--tensor-split", type=_tensor_split, metavar="A,B,...",
                   help="share of the offloaded layers per GPU, in llama.cpp's device order (as llama-server)")
    p.add_argument("--main-gpu", type=_non_negative, metavar="I",
                   help="use only GPU I (llama.cpp's device order), as llama-server's --split-mode none --main-gpu I")
    moe = p.add_mutually_exclusive_group()
    moe.add_argument("--cpu-moe", action="store_true",
                     help="a mixture-of-experts model keeps every layer's expert weights in host RAM, as llama-server's "
                          "--cpu-moe (default: the planner keeps as few there as let every layer's attention onto "
                          "the GPUs, and none where whole layers fit)")
    moe.add_argument("--n-cpu-moe", type=_non_negative, metavar="N",
                     help="keep the expert weights of the first N layers in host RAM, as llama-server's --n-cpu-moe")
    p.add_argument("--gpu-margin-mib", type=_non_negative, default=512, metavar="MIB",
                   help="memory each GPU keeps free: the larger of this and 5%% of the card (default 512)")
