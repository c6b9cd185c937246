"""The measurements document and the design document made from it (pure).

measurements.json holds every figure under a label: a measurement (value, unit, how it was measured) or
arithmetic over other labels (its formula, with the labels in braces). The design document is rendered from
that JSON alone, and cites every figure as **value unit** [`label`], so that `check` can prove each cited label
exists and each printed figure is the JSON's."""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import asdict, dataclass, field

from host_runtime.measure.requirement import Requirement

DOC_VERSION = 1
CITATION = re.compile(r"\*\*(?P<shown>[^*]+?)\*\* \[`(?P<label>[^`]+)`\]")
_LABEL_IN_FORMULA = re.compile(r"\{([^{}]+)\}")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


REQUIREMENT_NAMES = {"ttft_p50_s": "time to first token, median", "time_per_token_s": "time per token, median",
                     "concurrent_users": "users at once", "prompt_tokens": "a typical prompt",
                     "answer_tokens": "a typical answer"}


def fmt(value: float) -> str:
    """How a figure is printed, the same in the document and in its check."""
    if isinstance(value, bool):
        return str(value).lower()
    v = float(value)
    if v == 0:
        return "0"
    if abs(v) >= 1000 or (isinstance(value, int)):
        return str(int(round(v)))
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def evaluate(formula: str, values: dict[str, float]) -> float:
    """A formula over labels ({label} + - * / numbers and parentheses). KeyError for an unknown label,
    ValueError for anything else in it."""
    expr = _LABEL_IN_FORMULA.sub(lambda m: repr(float(values[m.group(1)])), formula)

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return float(node.value)
        raise ValueError(f"not arithmetic: {formula!r}")

    return walk(ast.parse(expr, mode="eval"))


@dataclass
class Figure:
    value: float
    unit: str
    how: str
    arithmetic: str = ""   # a formula over other labels; empty for a measurement


@dataclass
class Report:
    scope: str                                   # "box" or "fleet"
    requirement: Requirement
    figures: dict[str, Figure] = field(default_factory=dict)
    machines: list[dict] = field(default_factory=list)   # name, accelerators, host memory, roles [{role, why}]
    links: list[dict] = field(default_factory=list)      # name, carries, rtt label, throughput label
    kv: list[dict] = field(default_factory=list)         # per box: labels of bytes, transfer, prefill, ratio
    caches: list[dict] = field(default_factory=list)     # per box: hit ratio label, tier hit labels, saved label
    decisions: list[dict] = field(default_factory=list)  # text, labels
    not_measured: list[str] = field(default_factory=list)
    router: dict = field(default_factory=dict)           # bench/fleet.py's comparison: source, workload, labels

    def measured(self, label: str, value: float, unit: str, how: str) -> str:
        self.figures[label] = Figure(value, unit, how)
        return label

    def derived(self, label: str, formula: str, unit: str, how: str) -> str:
        values = {k: f.value for k, f in self.figures.items()}
        self.figures[label] = Figure(evaluate(formula, values), unit, how, formula)
        return label

    def stated(self) -> None:
        """The requirement's figures, under labels the document cites like any other."""
        for name, value in asdict(self.requirement).items():
            unit = "s" if name.endswith("_s") else ("users" if name == "concurrent_users" else "tokens")
            self.measured(f"requirement.{name}", value, unit, "stated in box.toml [requirement]")

    def to_json(self) -> dict:
        return {"version": DOC_VERSION, "scope": self.scope, "requirement": asdict(self.requirement),
                "figures": {k: asdict(v) for k, v in self.figures.items()}, "machines": self.machines,
                "links": self.links, "kv": self.kv, "caches": self.caches, "decisions": self.decisions,
                "not_measured": self.not_measured, "router": self.router}

    def add_router_bench(self, bench: dict, source: str) -> None:
        """bench/fleet.py's JSON (the gateway's cache_aware routing against round robin, and LiteLLM's Router when
        it ran, on the same boxes) as figures, their ratios as arithmetic, and the routing decision they justify.
        ValueError names what is missing."""
        try:
            # the router's cache_aware as shipped: a repeated run's own entry, an older run's "gateway"
            runs = {"cache_aware": bench.get("cache_aware") or bench["gateway"], "round_robin": bench["round_robin"]}
            if bench.get("litellm"):
                runs["litellm"] = bench["litellm"]
            labels = {}
            for policy, run in runs.items():
                for name, unit in (("prefix_hit_ratio", ""), ("ttft_p50_s", "s"), ("tok_s", "tokens/s")):
                    labels[f"{policy}.{name}"] = self.measured(
                        f"router.{policy}.{name}", float(run[name]), unit,
                        f"bench/fleet.py ({source}, {bench.get('when', 'undated')}): policy {run.get('policy', policy)}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not bench/fleet.py's JSON (missing or bad {exc})") from None
        ratios = [self.derived(f"router.{name}_vs_{other}",
                               f"{{router.cache_aware.{name}}} / {{router.{other}.{name}}}", "",
                               f"cache_aware against {other}")
                  for other in runs if other != "cache_aware"
                  for name in ("prefix_hit_ratio", "ttft_p50_s", "tok_s")
                  if self.figures[f"router.{other}.{name}"].value]
        self.router = {"source": source, "workload": bench.get("workload", {}), "labels": list(labels.values()),
                       "ratios": ratios}
        others = " and LiteLLM's Router (least-busy)" if "litellm" in runs else ""
        self.decisions.append({
            "text": "The gateway routes with sglang-router's cache_aware policy, fed by the capability maps, rather "
                    f"than round robin{others}: the ratios say how it compared on the same boxes and workload "
                    "(prefix hit ratio above 1 keeps more prompt tokens cached; TTFT below 1 answers sooner).",
            "labels": ratios})


def kv_conclusion(ratio: float) -> str:
    """One sentence on splitting prefill from decode, from (time to move one request's KV) / (time to prefill
    it here)."""
    if ratio >= 1:
        return ("moving a request's KV over this link takes longer than computing it, so splitting prefill from "
                "decode across boxes would not pay here")
    if ratio >= 0.25:
        return ("moving a request's KV costs a large share of computing it, so a prefill/decode split would save "
                "little and is not worth its complexity here")
    return ("moving a request's KV is much cheaper than computing it, so a split could pay where long prompts "
            "stall other users' decoding; it is not built, and the figures say where it would be worth building")


# ---- the document ---------------------------------------------------------------------------------------

def render(doc: dict) -> str:
    """The design document, from measurements.json's content only."""
    figures = doc["figures"]

    def c(label: str) -> str:
        f = figures[label]
        unit = f" {f['unit']}" if f["unit"] else ""
        return f"**{fmt(f['value'])}{unit}** [`{label}`]"

    def arith(label: str) -> str:
        return f"{c(label)} (arithmetic: `{figures[label]['arithmetic']}`)"

    scope = "this fleet" if doc["scope"] == "fleet" else "this box"
    out = [f"# The design of {scope}, measured",
           "",
           "Every figure below is printed in bold and followed by its label in brackets; the label is a key of "
           "`figures` in measurements.json, which says how it was measured. Figures marked *arithmetic* are "
           "computed from other labels by the formula shown, not measured.",
           "", "## Requirement", ""]
    out += [f"- {REQUIREMENT_NAMES.get(name, name)}: {c('requirement.' + name)}" for name in doc["requirement"]]
    load = [k for k in ("load.ttft_p50_s", "load.time_per_token_p50_s", "load.tokens_per_s") if k in figures]
    if load:
        out += ["", f"Measured with {c('requirement.concurrent_users')} at once through the endpoint: time to "
                f"first token p50 {c('load.ttft_p50_s')}, time per token p50 {c('load.time_per_token_p50_s')}, "
                f"{c('load.tokens_per_s')} in all."]
    out += ["", "## Machines and their roles", ""]
    for m in doc["machines"]:
        accel = ", ".join(f"{a['device']} ({a['description'] or 'no description'}"
                          + (f", {a['memory_bytes'] / 2**30:.1f} GiB" if a.get("memory_bytes") else "") + ")"
                          for a in m["accelerators"]) or "none reported"
        out += [f"### {m['name']}", "",
                f"- devices used by its models: {accel}",
                f"- host memory: {c(m['host_memory_label'])}; CPU threads: {c(m['cpu_threads_label'])}",
                "- roles:"]
        out += [f"  - {r['role']}: {r['why']}" for r in m["roles"]]
        out += [""]
    out += ["## Links", "", "| link | carries | round trip | throughput |", "|---|---|---|---|"]
    out += [f"| {link['name']} | {link['carries']} | {c(link['rtt'])} | {c(link['throughput'])} |"
            for link in doc["links"]]
    if doc.get("router"):
        r = doc["router"]
        w = r.get("workload") or {}
        out += ["", "## The router", "",
                f"From `{r['source']}` (bench/fleet.py: {w.get('boxes', '?')} boxes, {w.get('conversations', '?')} "
                f"conversations x {w.get('turns', '?')} turns, each turn extending the last):", ""]
        out += [f"- {label.split('.', 1)[1].replace('.', ' ')}: {c(label)}" for label in r["labels"]]
        out += [f"- {label.split('.', 1)[1].replace('_', ' ')}: {arith(label)}" for label in r["ratios"]]
    out += ["", "## One request's KV: move it or compute it?", ""]
    for k in doc["kv"]:
        out += [f"- {k['box']}: {c(k['bytes_per_token'])} per token, so a typical prompt's KV is "
                f"{arith(k['bytes_per_request'])}. Moving it over {k['link']} takes {arith(k['transfer_s'])}; "
                f"prefilling it here took {c(k['prefill_s'])} for {c(k['prefill_tokens'])}. The ratio is "
                f"{arith(k['ratio'])}: {k['conclusion']}."]
    out += ["", "## Cache tiers", ""]
    for cache in doc["caches"]:
        tiers = ", ".join(f"{t['tier']} {c(t['hits'])}" for t in cache["tiers"]) or "no tier served a lookup"
        out += [f"- {cache['box']}: in the multi-turn run it computed {c(cache['computed_tokens'])} of its prompts and "
                f"its prefix cache served {c(cache['cached_tokens'])} (hit ratio {arith(cache['hit_ratio'])}); lookups "
                f"{c(cache['lookups'])}, served by tier: {tiers}. At the measured prefill rate that saved "
                f"{arith(cache['saved_s'])}."]
    out += ["", "## Decisions", ""]
    out += [f"- {d['text']} Evidence: " + ", ".join(c(label) for label in d["labels"]) + "." for d in doc["decisions"]]
    out += ["", "## Not measured", ""]
    out += [f"- {line}" for line in doc["not_measured"]]
    return "\n".join(out) + "\n"


def check(text: str, doc: dict) -> list[str]:
    """Problems with a design document against its measurements: a cited label that does not exist, a printed
    figure that is not the JSON's, arithmetic that does not give its value. Empty when it holds."""
    figures = doc["figures"]
    problems = []
    cited = CITATION.findall(text)
    if not cited:
        problems.append("the document cites no figures")
    for shown, label in cited:
        if label not in figures:
            problems.append(f"{label}: cited but not in measurements.json")
            continue
        f = figures[label]
        expected = fmt(f["value"]) + (f" {f['unit']}" if f["unit"] else "")
        if shown != expected:
            problems.append(f"{label}: the document says {shown!r}, measurements.json {expected!r}")
    values = {k: f["value"] for k, f in figures.items()}
    for label, f in figures.items():
        if f.get("arithmetic"):
            try:
                got = evaluate(f["arithmetic"], values)
            except (KeyError, ValueError, ZeroDivisionError) as exc:
                problems.append(f"{label}: its arithmetic cannot be evaluated ({exc})")
                continue
            if abs(got - f["value"]) > 1e-9 * max(1.0, abs(got)):
                problems.append(f"{label}: {f['arithmetic']} gives {got}, not {f['value']}")
    return problems
