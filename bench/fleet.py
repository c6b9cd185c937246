"""The fleet gateway against round robin, the router's cache_aware alone and LiteLLM's least-busy over the same
boxes: a multi-turn workload with shared prefixes, each policy run --repeats times (alternated), ratios with spreads.

Three boxes (network namespaces, `everycycle serve` on 1 thread each, the built-in model) behind the gateway
(tests/fleet_hosts.py), each run on fresh boxes: "gateway" (the router's cache_aware fed by our controller routing
by each box's measured speed: fleet.toml's route_by_speed, on by default), "cache_aware" (the router's policy
alone), "round_robin" (the reference), and with --litellm LiteLLM's Router (least-busy). Several conversations run at
once, each turn extending the last (a long system prompt of its own, then user and assistant turns).
`--fleet hetero`: boxes that are not equal (HETERO: CPU quotas make box 1 several times faster than the others,
box 2 holds another model, which only it serves) and a mixed workload (fleet_workload.mixed_session: chats, one-shot
long prompts, chats with the other model). Measured:
- prefix hit ratio: prompt tokens the boxes' prefix caches served / all prompt tokens (everycycle_prompt_tokens_
  cached_total and everycycle_prompt_tokens_total, summed over the boxes, before and after);
- TTFT p50 and p95 (client side, streaming), and generated tokens per second over the run;
- the common model's tokens per second until its last answer (the other model's requests go to its one box
  whatever the policy: it is the common model's that routing decides);
- hetero: the other model's span (its box's fixed work, a floor under the wall) and tok_s_bound, everything generated
  over that span: the most tokens/s any routing of the common model reaches in that run.
Prints one JSON document (and writes it with --json PATH): `policies` (each figure's median and range over the
repeats), `ratios` (the gateway's over each other policy, repeat by repeat), `goals` (#62's lines, met where the
spread does not cross them) and every run.
Needs root (namespaces). Usage: sudo .venv/bin/python bench/fleet.py [--fleet hetero] [--repeats 3] [--litellm]
       [--without cache_aware,round_robin]
[--json F]"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx2  # noqa: E402
import openai  # noqa: E402

from host_runtime.engine.model import default_model_path  # noqa: E402
from tests.fleet_hosts import SMOL, box_metric, start_fleet  # noqa: E402

from serving import cpu_flags, cpu_name, paired_ratio, spread  # noqa: E402

from fleet_workload import conversation, mixed_session  # noqa: E402

OTHER = "Other-Model"  # the hetero fleet's second model: the built-in GGUF under another name, on box 2 only
# The hetero fleet: each box's share of one CPU (a cgroup quota) and the model it holds (None: the built-in one).
# Box 0 is also the gateway (its front, router and controller beside its API), so the fast box is box 1.
HETERO = {"cpu_percent": [30, 100, 30], "models": [None, None, OTHER]}

LITELLM = "litellm==1.110.2"   # the release router_vocab.py already checks by hash; not one of the two bad ones
LITELLM_VENV = Path(__file__).resolve().parents[1] / "var" / "bench-litellm-venv"


def litellm_python() -> Path:
    """LiteLLM in a venv of its own under var/ (made once, with this machine's pip configuration), so that its
    many dependencies never enter the box's venv."""
    python = LITELLM_VENV / "bin" / "python"
    if not python.exists():
        print(f"bench: making {LITELLM_VENV} with {LITELLM} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LITELLM], check=True)
    return python


def counters(fleet) -> tuple[float, float, list[float]]:
    """(prompt tokens cached, computed, summed over the boxes; tokens generated, per box)."""
    cached = sum(box_metric(fleet, i, "everycycle_prompt_tokens_cached_total") for i in range(len(fleet.boxes)))
    computed = sum(box_metric(fleet, i, "everycycle_prompt_tokens_total") for i in range(len(fleet.boxes)))
    generated = [box_metric(fleet, i, "everycycle_tokens_predicted_total") for i in range(len(fleet.boxes))]
    return cached, computed, generated


# The policies compared, by name: (the router's policy, whether the controller routes by speed). "gateway" routes
# by speed too (route_by_speed, fleet.toml's default); "cache_aware" is the router's policy alone.
GATEWAY_POLICIES = {"gateway": ("cache_aware", True), "cache_aware": ("cache_aware", False),
                    "round_robin": ("round_robin", False)}


def run(policy: str, conversations: int, turns: int, max_tokens: int, hetero: bool = False) -> dict:
    """policy: one of GATEWAY_POLICIES (clients through the gateway's front); "litellm" (LiteLLM's Router,
    least-busy, straight to the same boxes with the fleet key from the gateway's namespace); or "sticky" (no
    router: conversation n always on one box that holds its model, n mod their number: the ceiling of this
    workload's hit ratio)."""
    litellm = litellm_python() if policy == "litellm" else None
    direct = litellm or policy == "sticky"
    router_policy, by_speed = GATEWAY_POLICIES.get(policy, ("round_robin", False))
    with tempfile.TemporaryDirectory(prefix=f"bench-fleet-{policy}-") as tmp:
        models = [None, None, None]
        if hetero:
            other = Path(tmp) / f"{OTHER}.gguf"
            shutil.copy(default_model_path(), other)
            models = [str(other) if m == OTHER else m for m in HETERO["models"]]
        fleet = start_fleet(Path(tmp), models, policy=router_policy, route_by_speed=by_speed, parallel=4,
                            max_queue=256, ctx_size=2048, cpu_percent=HETERO["cpu_percent"] if hetero else None)
        holders = {m: [i for i, b in enumerate(fleet.boxes) if m in b.models] for m in (SMOL, OTHER)}
        try:
            before = counters(fleet)
            results: list[dict] = []
            if litellm:
                argv = [str(litellm), str(Path(__file__).resolve().parent / "fleet_litellm.py"),
                        *[a for b in fleet.boxes for a in ("--box", f"{b.base}={','.join(b.models)}")],
                        "--key", fleet.fleet_key, "--model", SMOL, "--conversations", str(conversations),
                        "--turns", str(turns), "--max-tokens", str(max_tokens),
                        *(["--other-model", OTHER] if hetero else [])]
                out = subprocess.run(fleet.net.run_in(0, argv), capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(f"bench: the LiteLLM client failed:\n{out.stderr[-3000:]}")
                doc = json.loads(out.stdout.strip().splitlines()[-1])
                results, wall, start = doc["results"], doc["wall_s"], doc["started"]
            else:
                if policy == "sticky":  # box 0's API from here: its Unix socket (its TCP listener is its loopback)
                    clients = [openai.OpenAI(
                        base_url=("http://box0" if i == 0 else b.base) + "/v1", api_key=fleet.fleet_key,
                        max_retries=0, timeout=300, http_client=httpx2.Client(transport=httpx2.HTTPTransport(
                            uds=str(fleet.workdir / "box0_api" / "http.sock"))) if i == 0 else None)
                        for i, b in enumerate(fleet.boxes)]
                else:
                    clients = [openai.OpenAI(base_url=fleet.url + "/v1", api_key=fleet.client_key, max_retries=0,
                                             timeout=300, http_client=httpx2.Client(verify=fleet.tls()))]

                def sender(n: int):
                    def send(messages, model=SMOL):
                        # sticky: the session's box among those that hold its model; else the one client
                        c = clients[holders[model][n % len(holders[model])]] if len(clients) > 1 else clients[0]
                        for chunk in c.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                                               temperature=0, stream=True):
                            if chunk.choices:
                                yield chunk.choices[0].delta.content
                    return send

                lock = threading.Lock()
                start = time.monotonic()
                with ThreadPoolExecutor(max_workers=conversations) as pool:
                    if hetero:
                        list(pool.map(lambda n: mixed_session(sender(n), n, turns, results, lock, SMOL, OTHER),
                                      range(conversations)))
                    else:
                        list(pool.map(lambda n: conversation(sender(n), n, turns, results, lock),
                                      range(conversations)))
                wall = time.monotonic() - start
            after = counters(fleet)
            per_box = [box_metric(fleet, i, "everycycle_requests_total") for i in range(len(fleet.boxes))]
        finally:
            fleet.stop()
    cached, computed = after[0] - before[0], after[1] - before[1]
    per_box_generated = [a - b for a, b in zip(after[2], before[2])]
    generated = sum(per_box_generated)
    # The common model's own throughput: what routing decides (the other model has one box, whatever the policy),
    # its tokens over the time until its last answer ended.
    common = [r for r in results if r.get("kind") != "other-model"]
    common_span = max(r["ended"] for r in common) - start if common else wall
    # The other model's one box ends its sessions when it ends them, whatever the policy does with the common
    # model: the run's wall is at least that long, so generated / that span is the most tok/s any routing reaches.
    other = [r for r in results if r.get("kind") == "other-model"]
    other_span = max(r["ended"] for r in other) - start if other else None
    common_generated = sum(per_box_generated[i] for i in holders[SMOL])
    ttfts = sorted(r["ttft_s"] for r in results if r["ttft_s"] is not None)
    by_kind = {}
    for kind in sorted({r.get("kind") for r in results if r.get("kind")}):
        kind_ttfts = [r["ttft_s"] for r in results if r.get("kind") == kind and r["ttft_s"] is not None]
        by_kind[kind] = round(statistics.median(kind_ttfts), 4) if kind_ttfts else None
    return {"policy": "litellm least-busy" if litellm else policy,
            **({"router_policy": router_policy, "route_by_speed": by_speed} if not direct else {}),
            "requests": len(results), "wall_s": round(wall, 2),
            "common_model_tok_s": round(common_generated / common_span, 2) if common_span > 0 else None,
            "common_model_span_s": round(common_span, 2),
            **({"other_model_span_s": round(other_span, 2), "tok_s_bound": round(generated / other_span, 2)}
               if other_span else {}),
            **({"ttft_p50_s_by_kind": by_kind} if by_kind else {}),
            "prefix_hit_ratio": round(cached / (cached + computed), 4) if cached + computed else 0.0,
            "prompt_tokens_cached": int(cached), "prompt_tokens_computed": int(computed),
            "ttft_p50_s": round(statistics.median(ttfts), 4),
            "ttft_p95_s": round(ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))], 4),
            "tok_s": round(generated / wall, 2), "requests_per_box": [int(x) for x in per_box]}


RATIO_KEYS = ("tok_s", "common_model_tok_s", "ttft_p50_s", "ttft_p95_s", "prefix_hit_ratio")
# The goals #62 set, as (key, reference, bound, "min" or "max"): the spread must not cross the bound.
GOALS = (("tok_s", "round_robin", 2.0, "min"), ("ttft_p95_s", "round_robin", 0.5, "max"),
         ("tok_s", "litellm", 1.2, "min"))


def ratios(runs: dict[str, list[dict]], name: str, reference: str) -> dict:
    """`name`'s figures over `reference`'s, repeat by repeat (each repeat runs every policy once, the order
    alternated), as spreads."""
    out = {}
    for key in RATIO_KEYS:
        figure = paired_ratio(runs[name], runs[reference], key)
        if figure:
            out[f"{key}_vs_{reference}"] = figure
    return out


def goals(ratio_table: dict) -> list[dict]:
    out = []
    for key, reference, bound, side in GOALS:
        figure = ratio_table.get(f"{key}_vs_{reference}")
        if figure is None:
            continue
        met = figure["min"] >= bound if side == "min" else figure["max"] <= bound
        out.append({"ratio": f"{key}_vs_{reference}", "goal": f"{'at least' if side == 'min' else 'at most'} {bound}",
                    "median": figure["median"], "spread": [figure["min"], figure["max"]], "met": met})
    return out


def bound_ratio(runs: list[dict], reference: list[dict]) -> dict | None:
    """The most `runs`' policy could reach over `reference`'s tok/s, repeat by repeat: its tok_s_bound (the other
    model's box's fixed work bounds the wall) over the reference's tok_s. Where this spread is under one of GOALS'
    lines, no routing of the common model meets that line on this workload."""
    return spread([r["tok_s_bound"] / ref["tok_s"] for r, ref in zip(runs, reference)
                   if r.get("tok_s_bound") and ref.get("tok_s")])


def router_alone_ratios(runs: dict[str, list[dict]], order: list[str]) -> dict:
    """The router's cache_aware alone (route_by_speed = false) over round robin and LiteLLM, and #62's goals on
    those spreads."""
    table = {}
    for reference in ("round_robin", "litellm"):
        if reference in order and "cache_aware" in order:
            table.update(ratios(runs, "cache_aware", reference))
    return {"ratios_router_alone": table, "goals_router_alone": goals(table)}


def summary(runs: list[dict]) -> dict:
    return {key: spread([r.get(key) for r in runs]) for key in ("tok_s", "common_model_tok_s", "ttft_p50_s",
                                                                 "ttft_p95_s", "prefix_hit_ratio", "wall_s",
                                                                 "other_model_span_s", "tok_s_bound")}


def measure_doc(bench_json: Path, out_dir: Path) -> None:
    """`everycycle measure --fleet` on a fresh fleet (the gateway as shipped: routing by speed), citing this run's
    JSON."""
    from tests.servers import everycycle

    out_dir.mkdir(parents=True, exist_ok=True)
    box_toml = out_dir / "box.toml"
    if not box_toml.exists():
        box_toml.write_text("[requirement]\nttft_p50_s = 3.0\ntime_per_token_s = 0.25\nconcurrent_users = 3\n"
                            "prompt_tokens = 256\nanswer_tokens = 32\n")
    with tempfile.TemporaryDirectory(prefix="bench-fleet-measure-") as tmp:
        fleet = start_fleet(Path(tmp), [None, None, None], parallel=4, max_queue=256, ctx_size=2048,
                            route_by_speed=True)
        try:
            subprocess.run(fleet.net.run_in(0, everycycle(
                "measure", "--fleet", "--fleet-settings", str(fleet.workdir / "fleet.toml"), "--url", fleet.url,
                "--ca-cert", str(fleet.certificate), "--box-toml", str(box_toml), "--fleet-bench", str(bench_json),
                "--json", str(out_dir / "measurements.json"), "--doc", str(out_dir / "architecture.md"))),
                check=True)
        finally:
            fleet.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleet", choices=["equal", "hetero"], default="equal",
                   help="equal: three equal boxes, one model; hetero: HETERO's unequal boxes, two models, a mixed "
                        "workload")
    p.add_argument("--conversations", type=int, default=9)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3, help="each policy this many times, alternated (default 3)")
    p.add_argument("--json", type=Path, help="write the result here too")
    p.add_argument("--litellm", action="store_true", help=f"also LiteLLM's Router ({LITELLM}, least-busy)")
    p.add_argument("--without", default="", metavar="POLICY,...",
                   help="leave out these of the router's own references (cache_aware, round_robin): a shorter run "
                        "when only the gateway against LiteLLM is asked")
    p.add_argument("--sticky", action="store_true",
                   help="also the workload's ceiling: each conversation pinned to one box, no router")
    p.add_argument("--doc", type=Path, metavar="DIR",
                   help="then run `everycycle measure --fleet` citing this run (needs --json): DIR/measurements.json, "
                        "DIR/architecture.md ([requirement] from DIR/box.toml when there is one)")
    args = p.parse_args()
    if args.doc and not args.json:
        p.error("--doc: needs --json (the document cites that file)")
    hetero = args.fleet == "hetero"
    left_out = {name for name in args.without.split(",") if name}
    if unknown := left_out - (set(GATEWAY_POLICIES) - {"gateway"}):
        p.error(f"--without: cache_aware or round_robin, not {', '.join(sorted(unknown))}")
    order = [*(name for name in GATEWAY_POLICIES if name not in left_out), *(["litellm"] if args.litellm else []),
             *(["sticky"] if args.sticky else [])]
    runs: dict[str, list[dict]] = {name: [] for name in order}
    for repeat in range(args.repeats):  # every policy once a repeat, the order reversed every other repeat
        for name in (order if repeat % 2 == 0 else order[::-1]):
            print(f"bench: repeat {repeat + 1} of {args.repeats}: {name}", file=sys.stderr, flush=True)
            runs[name].append(run(name, args.conversations, args.turns, args.max_tokens, hetero))
    ratio_table = {}
    for reference in order[1:]:
        if reference != "sticky":
            ratio_table.update(ratios(runs, "gateway", reference))
    doc = {"bench": "fleet", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "machine": {"cpus": os.cpu_count(), "cpu": cpu_name(), "cpu_flags": cpu_flags(),
                       "python": platform.python_version()},
           "workload": {"fleet": args.fleet, "boxes": 3, "threads_per_box": 1, "conversations": args.conversations,
                        "turns": args.turns, "max_tokens": args.max_tokens, "model": SMOL, "repeats": args.repeats,
                        "order": "every policy once a repeat, reversed every other repeat",
                        **({"cpu_percent": HETERO["cpu_percent"], "box_models": [m or SMOL for m in HETERO["models"]],
                            "sessions": "chat, one-shot long prompts, chat with the other model (by n mod 3)"}
                           if hetero else {})},
           "policies": {name: summary(r) for name, r in runs.items()},
           "ratios": ratio_table, "goals": goals(ratio_table), **router_alone_ratios(runs, order), "runs": runs,
           # each policy's medians under its own name, as `everycycle measure --fleet-bench` reads them
           **{name: {"policy": r[0]["policy"], **{k: v["median"] for k, v in summary(r).items() if v}}
              for name, r in runs.items()}}
    if hetero and "litellm" in order:
        doc["ratios"]["tok_s_bound_vs_litellm"] = bound_ratio(runs["gateway"], runs["litellm"])
    if args.sticky:  # how close each router comes to the hit ratio this workload allows
        doc["ratios"]["prefix_hit_ratio_of_ceiling"] = {
            name: paired_ratio(runs[name], runs["sticky"], "prefix_hit_ratio") for name in order if name != "sticky"}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if args.doc:
        measure_doc(args.json.resolve(), args.doc.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
