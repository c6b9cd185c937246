"""`everycycle models list | show | add | pull | rm | pin | set | default`: the command line over the store."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from host_runtime.admin import model_actions as actions
from host_runtime.common import run_layout
from host_runtime.models import pull as pulling
from host_runtime.models.errors import StoreError
from host_runtime.models.store import Store


def add_parser(sub) -> None:
    models = sub.add_parser("models", help="the model store: list, add, pull, remove, pin and set models, and choose "
                                           "the one served",
                            description="Models kept on the box's data partition ($EVERYCYCLE_MODEL_STORE, else "
                                        "/var/lib/everycycle/models).")
    models.add_argument("--store", type=Path, metavar="DIR", help="the store's directory (default: as above)")
    m_sub = models.add_subparsers(dest="models_command", metavar="ACTION", required=True)
    listing = m_sub.add_parser("list", help="every model in the store")
    show = m_sub.add_parser("show", help="one model's manifest")
    show.add_argument("name", metavar="NAME")
    add = m_sub.add_parser("add", help="copy a GGUF file on this machine into the store")
    add.add_argument("file", type=Path, metavar="FILE")
    add.add_argument("--mmproj", type=Path, metavar="FILE",
                     help="the model's vision projector (a clip GGUF, mmproj-*.gguf), kept beside it and served with "
                          "it wherever it is loaded: requests may then carry images")
    pull = m_sub.add_parser("pull", help="download a model: an http(s) URL on the LAN, hf://OWNER/REPO/FILE.gguf, or "
                                         "hf://OWNER/REPO:QUANT; refused before the download where it does not fit")
    pull.add_argument("source", metavar="SOURCE")
    pull.add_argument("--no-fit-check", action="store_true",
                      help="pull it even where the planner, reading its header first, says this box cannot run it "
                           "(for another box, or once memory is added)")
    for p in (add, pull):
        p.add_argument("--name", metavar="NAME", help="the model's name (default: the file's name without .gguf)")
        p.add_argument("--sha256", metavar="HEX", help="refuse the file unless its sha256 is this")
    search = m_sub.add_parser("search", help="GGUF repositories on the Hugging Face Hub (HF_ENDPOINT where set) "
                                             "matching TEXT, each quantization's size, whether it is likely to fit "
                                             "this box, and the name that pulls it")
    search.add_argument("text", metavar="TEXT")
    search.add_argument("--limit", type=int, default=10, metavar="N", help="repositories at most (default 10)")
    listed = m_sub.add_parser("catalog", help="the models this box pulls by a short name (qwen3:8b): the shipped "
                                              "catalog and the owner's own ($EVERYCYCLE_STATE_DIR/catalog.toml)")
    listed.add_argument("--fit", action="store_true",
                        help="read each repository's listing (the Hub, or HF_ENDPOINT) for its quantizations' sizes "
                             "and say which fits this box best")
    rm = m_sub.add_parser("rm", help="remove a model")
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--force", action="store_true", help="remove it even when pinned or being served")
    pin = m_sub.add_parser("pin", help="keep a model loaded and protected from rm (--off to undo)")
    pin.add_argument("name", metavar="NAME")
    pin.add_argument("--off", action="store_true", help="unpin")
    own = m_sub.add_parser("set", help="a model's own serving settings, which win over box.toml's [serving] wherever "
                                       "it is loaded (from its next load)")
    own.add_argument("name", metavar="NAME")
    own.add_argument("--ctx-size", type=int, metavar="N", help="context tokens per sequence (0: box.toml's)")
    own.add_argument("--parallel", type=int, metavar="N", help="sequences at once (0: box.toml's)")
    own.add_argument("--kv-budget-mib", type=int, metavar="MIB", help="the KV cache's memory (0: box.toml's)")
    own.add_argument("--speculation", choices=["off", "ngram", ""], help="drafting ('': box.toml's)")
    own.add_argument("--clear", action="store_true", help="drop every setting of its own first")
    default = m_sub.add_parser("default", help="the model the serving service starts with (and answers a request "
                                               "naming none), from the store or the built-in one; restarts it")
    default.add_argument("name", nargs="?", metavar="NAME", help="a model of the store")
    default.add_argument("--built-in", action="store_true", help="the image's built-in model")
    default.add_argument("--settings", type=Path, metavar="FILE",
                         help="the serving settings to change (default: $EVERYCYCLE_STATE_DIR/serving.toml, else "
                              "/etc/everycycle/serving.toml)")
    default.add_argument("--no-restart", action="store_true", help="only write the setting: it applies at the "
                                                                   "serving service's next start")
    for p in (listing, show, add, pull, pin, own, search, listed):
        p.add_argument("--json", action="store_true", help="print JSON")


def _search(args) -> int:
    """The Hub's GGUF repositories for args.text, each quantization judged by its size against this box's room
    (host RAM and GPU memory free); the pull then asks the planner from the chosen file's header."""
    from host_runtime.models.hub_search import by_size, search
    from host_runtime.placement.session import live_devices

    if not 1 <= args.limit <= 100:
        raise StoreError(f"--limit: {args.limit} is not 1 to 100")
    devices, host = live_devices()
    room = host.available_bytes + sum(d.free_bytes for d in devices)
    found = search(args.text, args.limit)
    if args.json:
        print(json.dumps([{"repository": repo, "quantizations": [
            {"quantization": q.quant, "size_bytes": q.size_bytes, "files": q.parts, "projector": q.projector,
             "fit_by_size": by_size(q.size_bytes, room), "pull": q.source}
            for q in quants]} for repo, quants in found], indent=2))
        return 0
    if not found:
        print(f"no GGUF repositories match {args.text!r}")
        return 0
    print(f"room for a model on this box: {room / 2**30:.1f} GiB (free host RAM and GPU memory); `models pull` "
          "then reads the file's header and asks the planner before downloading")
    for repo, quants in found:
        print(f"\n{repo}" + ("  (with a vision projector)" if quants and quants[0].projector else ""))
        if not quants:
            print("  no GGUF file named by its quantization")
        for q in quants:
            size, fit, pull = q.row(room)
            print(f"  {q.quant:10} {size:>10}  {fit:12} everycycle models pull {pull}")
    return 0


def _catalog(args) -> int:
    """The catalog's entries; with --fit, the quantization of each that fits this box best by size (the largest
    that is likely to fit), from its repository's listing."""
    from host_runtime.models import catalog

    entries = catalog.entries()
    best: dict[str, str] = {}
    if args.fit:
        best = _best_fits(entries)
    if args.json:
        print(json.dumps([{**e.model_dump(), "name": e.full_name, "store_name": e.store_name, "pull": e.source(),
                           **({"fits_best": best.get(e.full_name)} if args.fit else {})} for e in entries], indent=2))
        return 0
    for e in entries:
        fit = f"  best here: {best.get(e.full_name)}" if args.fit else ""
        print(f"{e.full_name:24} {', '.join(e.can):20} {e.context:>7}  {e.license:20} {e.source()}{fit}\n"
              f"{'':24} {e.why}")
    return 0


def _best_fits(entries) -> dict[str, str]:
    from host_runtime.models.hub_search import LIKELY_FITS, by_size, listing_sizes, quantizations
    from host_runtime.placement.session import live_devices

    devices, host = live_devices()
    room = host.available_bytes + sum(d.free_bytes for d in devices)
    out = {}
    for e in entries:
        try:
            files = listing_sizes(e.repo)
        except (StoreError, OSError) as exc:
            out[e.full_name] = f"unknown ({exc})"
            continue
        if e.file:
            size = dict(files).get(e.file)
            out[e.full_name] = "not in its repository" if size is None else \
                f"{e.file} ({size / 2**20:,.0f} MiB, {by_size(size, room)})"
            continue
        sizes = {q.quant: q.size_bytes for q in quantizations(e.repo, files)}
        fitting = [q for q in e.quants if q in sizes and by_size(sizes[q], room) == LIKELY_FITS]
        chosen = max(fitting, key=lambda q: sizes[q], default=None)
        out[e.full_name] = (f"{chosen} ({sizes[chosen] / 2**30:.1f} GiB): {e.source(chosen)}" if chosen else
                            "none of its quantizations fits by size")
    return out


def _fits_here(source: str):
    """The planner's verdict for a source on this machine's devices and free memory, at the engine's default
    context (models/verdict.py: the header's tensor table, read by a range request)."""
    from host_runtime.engine.limits import DEFAULT_CTX
    from host_runtime.models.verdict import verdict_for

    return verdict_for(source, None, DEFAULT_CTX)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(parser: argparse.ArgumentParser, args) -> int:
    store = Store(args.store)
    if args.models_command == "default" and bool(args.name) == args.built_in:
        parser.error("models default: give a model's NAME or --built-in")
    try:
        return _run(args, store)
    except StoreError as exc:
        print(f"everycycle models {args.models_command}: {exc}", file=sys.stderr)
        return 1


def _print_partials(store: Store) -> None:
    """The pulls' parts: running, or left by a pull that stopped (the same pull resumes it)."""
    from host_runtime.models.pull_slots import PARTIAL_TTL_S, partials
    from host_runtime.models.store import PARTIAL

    folder = store.root / PARTIAL
    parts = partials(folder) if folder.is_dir() else []
    if not parts:
        return
    print(f"\npartial downloads (the same pull resumes one; removed {PARTIAL_TTL_S / 86400:.0f} days after its last "
          "byte):")
    for p in parts:
        of = f" of {p.total_bytes / 2**20:,.1f}M" if p.total_bytes else ""
        when = "being pulled now" if p.running else f"stopped {p.age_s / 3600:,.1f} h ago"
        print(f"  {p.name:30} {p.done_bytes / 2**20:9,.1f}M{of}  {when}")


def _print(manifest, as_json: bool) -> None:
    print(json.dumps(asdict(manifest), indent=2) if as_json else
          f"{manifest.name}: {manifest.size / 2**20:,.1f} MiB, {manifest.architecture} {manifest.quantization}, "
          f"context {manifest.context_length}{', pinned' if manifest.pinned else ''}")


def _run(args, store: Store) -> int:
    command = args.models_command
    if command == "list":
        models = store.list()
        if args.json:
            print(json.dumps([asdict(m) for m in models], indent=2))
        elif not models:
            print(f"no models in {store.root} (everycycle models pull SOURCE, or add FILE)")
        else:
            print(f"{'NAME':32} {'SIZE':>10} {'ARCH':10} {'QUANT':8} {'CONTEXT':>8}  {'KIND':16} PINNED")
            for m in models:
                kind = ("speech to text" if m.architecture == "whisper" else f"embedding ({m.pooling})" if m.pooling
                        else "chat, images" if m.projector else "chat")
                print(f"{m.name:32} {m.size / 2**20:9,.1f}M {m.architecture:10} {m.quantization:8} "
                      f"{m.context_length:>8}  {kind:16} {'yes' if m.pinned else ''}")
        if not args.json:
            _print_partials(store)
        return 0
    if command == "show":
        manifest = store.get(args.name)
        own = {k: v for k, v in asdict(store.settings_of(args.name)).items() if v}
        shown = {**asdict(manifest), "path": str(store.path_of(manifest)), "settings": own}
        print(json.dumps(shown, indent=2) if args.json else "\n".join(f"{k:15} {v}" for k, v in shown.items()))
        return 0
    if command == "add":
        _print(pulling.add(store, args.file, args.name, args.sha256, _say, projector=args.mmproj), args.json)
        return 0
    if command == "search":
        return _search(args)
    if command == "catalog":
        return _catalog(args)
    if command == "pull":
        _print(pulling.pull(store, args.source, args.name, args.sha256, _say,
                            fits=None if args.no_fit_check else _fits_here), args.json)
        return 0
    if command == "rm":
        print(actions.remove(store, args.name, force=args.force, say=_say))
        return 0
    if command == "pin":
        _print(store.set_pinned(args.name, not args.off), args.json)
        return 0
    if command == "set":
        return _set_own(args, store)
    if command == "default":
        return _set_default(args, store)
    raise AssertionError(command)


def _set_own(args, store: Store) -> int:
    from dataclasses import replace

    from host_runtime.common.settings_file import SettingsError
    from host_runtime.models.model_settings import ModelSettings

    current = ModelSettings() if args.clear else store.settings_of(args.name)
    given = {"context_length": args.ctx_size, "parallel": args.parallel, "kv_budget_mib": args.kv_budget_mib,
             "speculation": args.speculation}
    try:
        updated = replace(current, **{k: v for k, v in given.items() if v is not None})
    except SettingsError as exc:
        option = {"context_length": "ctx-size", "kv_budget_mib": "kv-budget-mib"}.get(exc.field, exc.field)
        raise StoreError(f"--{option}: {exc.message}") from None
    store.set_settings(args.name, updated)
    own = {k: v for k, v in asdict(updated).items() if v}
    if args.json:
        print(json.dumps(own))
    else:
        print(f"{args.name}: " + (", ".join(f"{k} {v}" for k, v in own.items()) or "box.toml's settings") +
              (" (from its next load)" if args.name in actions.loaded_models() else ""))
    return 0


def _set_default(args, store: Store) -> int:
    print(actions.set_default(store, None if args.built_in else args.name,
                              args.settings or run_layout.serving_settings_file(), restart=not args.no_restart,
                              say=_say))
    return 0
