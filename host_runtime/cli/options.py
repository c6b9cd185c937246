"""The option types and option groups several subcommands share, and the CLI's defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import typing

from host_runtime.common import run_layout
from host_runtime.engine.limits import (DRAFT_CEILING, DRAFT_MAX, GPU_MARGIN_MIB, PREFIX_CACHE_DISK_MIB,
                                       PREFIX_CACHE_RAM_MIB)
from host_runtime.engine.readiness import WedgePolicy
from host_runtime.common.setting_rules import SettingsError, Tunable, check_value, hint_parts, tunables
from host_runtime.serving.settings import ServingSettings


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
    if value > DRAFT_CEILING:
        raise argparse.ArgumentTypeError(f"must be at most {DRAFT_CEILING}, got {value}")
    return value


def _probability_below_one(text: str) -> float:
    value = _number(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1, got {text}")
    return value


def _run_dir(explicit: str | None = None) -> Path:
    """Where the services publish (common/run_layout.py)."""
    return run_layout.run_dir(explicit)


# The flags a serving setting makes (serving/settings.py declares each once), by the field's name
ENGINE_SETTINGS = ("context_length", "parallel", "kv_budget_mib", "cache_type_k", "cache_type_v", "speculation")
SERVE_SETTINGS = ("keep_alive", "models_memory_mib")
_METAVARS = {"keep_alive": "DURATION", "cache_type_k": "TYPE", "cache_type_v": "TYPE"}


def serving_tunable(name: str) -> Tunable:
    return tunable_of(ServingSettings, name)


def tunable_of(cls, name: str) -> Tunable:
    return next(t for t in tunables(cls) if t.name == name)


def _checked_by_settings(cls, tunable: Tunable):
    """The flag's text as the setting's type, checked by the setting's own rule: a flag takes what the service's
    file takes, and its error says the same words."""
    base = hint_parts(tunable.hint)[0]
    word = {int: "a whole number", float: "a number"}.get(base)

    def parse(text: str):
        try:
            value = base(text) if word else text
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {word}: {text!r}") from None
        try:
            if typing.get_origin(tunable.hint) is typing.Annotated:
                check_value(tunable.name, tunable.hint, value)  # 0 too: "unset" is the file's word, not a flag's
            else:
                cls(**{tunable.name: value})  # a rule the class checks itself (keep_alive's)
        except SettingsError as exc:
            raise argparse.ArgumentTypeError(exc.message) from None
        return value

    return parse


def add_setting_flags(p: argparse.ArgumentParser, names: tuple[str, ...], cls=ServingSettings) -> None:
    """The flags of these settings of `cls`, made from their declarations: name, rule, help and default said once.
    Not given, a flag is None: the command then takes the settings file's value (serve: the model's own first),
    else the declared default."""
    for name in names:
        tunable = tunable_of(cls, name)
        base = hint_parts(tunable.hint)[0]
        choices = typing.get_args(base) + tunable.flag_also if typing.get_origin(base) is typing.Literal else None
        help_text = (tunable.described + tunable.flag_details).replace("%", "%%")
        if choices:
            p.add_argument(tunable.flag, choices=list(choices), metavar=_METAVARS.get(name), help=help_text)
        else:
            metavar = _METAVARS.get(name, "MIB" if name.endswith("_mib") else "C" if name.endswith("_c") else "N")
            p.add_argument(tunable.flag, type=_checked_by_settings(cls, tunable), metavar=metavar, help=help_text)


def _add_engine_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--threads", type=_non_negative, default=0, metavar="N", help="CPU threads for llama.cpp (0: all cores)")
    p.add_argument("--decode-threads", type=_non_negative, default=0, metavar="N",
                   help="CPU threads for a decode call of one token, a lone stream's step (0: as --threads)")
    add_setting_flags(p, ENGINE_SETTINGS)
    p.add_argument("--max-queue", type=_non_negative, metavar="N",
                   help="requests allowed to wait for a sequence before new ones get 503 (default 4 per sequence)")
    p.add_argument("--prefix-cache-ram-mib", type=_non_negative, default=PREFIX_CACHE_RAM_MIB, metavar="MIB",
                   help=f"host RAM for cached prompt prefixes moved out of the context (default {PREFIX_CACHE_RAM_MIB})")
    p.add_argument("--prefix-cache-disk-mib", type=_non_negative, default=PREFIX_CACHE_DISK_MIB, metavar="MIB",
                   help=f"disk space for cached prompt prefixes moved out of RAM (default {PREFIX_CACHE_DISK_MIB})")
    p.add_argument("--prefix-cache-dir", metavar="DIR",
                   help="where the disk tier lives (serve: RUN_DIR/prefix-cache; engine: no disk tier without it)")
    p.add_argument("--no-prefix-cache", action="store_true", help="recompute every prompt from scratch")
    p.add_argument("--mixed-batches", action="store_true",
                   help="prompt chunks and decode tokens in one llama_decode call over one shared KV buffer, as "
                        "llama-server batches; a request's output then depends on what else is batched (default: "
                        "batch-invariant, the faster of the two on CPU as measured by bench/serving.py)")
    p.add_argument("--draft-max", type=_draft_max, default=DRAFT_MAX, metavar="N",
                   help=f"the most tokens a sequence drafts in a step, 1 to {DRAFT_CEILING}; up to this, each "
                        f"sequence drafts as many as its acceptance and the measured cost of calls say pay (default {DRAFT_MAX})")
    p.add_argument("--draft-always", action="store_true",
                   help="draft as much as acceptance earned and the step has room for, whatever the calls cost "
                        "(default: only as much as the measured cost of this box's decode calls says pays; on a "
                        "small CPU bound by computation that is often nothing)")
    p.add_argument("--draft-p-min", type=_probability_below_one, default=0.0, metavar="P",
                   help="with --speculation draft: the draft stops at a token the draft model gives less than P "
                        "(a likely rejection; default 0: never, as llama.cpp's default)")
    p.add_argument("--mmproj", metavar="PATH",
                   help="the model's projector GGUF (llama-server's --mmproj): requests may then carry images, "
                        "encoded by it (models loaded on demand beside it run without)")
    p.add_argument("--draft-model", metavar="PATH",
                   help="with --speculation draft: the GGUF that drafts for the served model (models loaded on "
                        "demand beside it run without); its tokens must be the target's (loaded after the target, "
                        "placed by the same planner, with as many sequences)")
    p.add_argument("--wedge-floor", type=_positive_float, default=WedgePolicy.floor_s, metavar="S",
                   help="the engine counts as wedged when pending work sees no decode call complete for the larger "
                        f"of this and {WedgePolicy.multiple:g}x its expected call time, measured (default "
                        f"{WedgePolicy.floor_s:g})")
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
    p.add_argument("--shard-host", action="append", type=_host_port, metavar="ADDR:PORT",
                   help="a box of the fleet lending its devices (its `everycycle fleet shard-host --listen`), "
                        "repeatable: its devices (RPC0, RPC1, ... in this order) take layers like this box's GPUs")
    p.add_argument("--shard-key-file", metavar="FILE",
                   help="with --shard-host: the fleet key's file (0600), which the wire's TLS is keyed from, or the "
                        "members' own wire keys (`everycycle fleet shard-key --member A --member B`)")
    p.add_argument("--gpu-margin-mib", type=_non_negative, default=GPU_MARGIN_MIB, metavar="MIB",
                   help=f"memory each GPU keeps free: the larger of this and 5%% of the card (default {GPU_MARGIN_MIB})")
