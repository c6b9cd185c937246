"""The console's models screen: the store's models, the one serving starts with, and pulling, switching and
removing them at the box (admin/model_actions.py and models/pull.py do the work, as for `everycycle models`)."""

from __future__ import annotations

import json
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static

from host_runtime.common import settings_file
from host_runtime.common.run_layout import topology_file
from host_runtime.console.from_worker import draw_from_worker
from host_runtime.engine.limits import DEFAULT_CTX
from host_runtime.admin import model_actions as actions
from host_runtime.models import pull as pulling
from host_runtime.models.errors import StoreError
from host_runtime.models.store import Store
from host_runtime.models.verdict import VerdictError, verdict_for
from host_runtime.serving.settings import ServingSettings


class Models(ModalScreen):
    BINDINGS = [Binding("escape", "app.pop_screen", "close"), Binding("d", "make_default", "make default"),
                Binding("x", "remove", "remove"), Binding("p", "pull", "pull"), Binding("n", "pin", "pin/unpin"),
                Binding("s", "search", "search the Hub")]

    def __init__(self, store_root: Path | None, settings_path: Path | None, run_dir: Path):
        super().__init__()
        self.store_root = store_root
        self.settings_path = settings_path
        self.run_dir = run_dir
        self._asking: str | None = None  # "pull" or "remove:NAME": what the input line is for
        self._verdicts: dict[str, str] = {}  # store model -> its verdict line, planned once per screen

    def compose(self) -> ComposeResult:
        yield Static("Models (d: make the selected one the default and restart serving, n: pin or unpin (kept "
                     "loaded, kept from removal), x: remove, p: pull a catalog name or a URL, s: search the Hub, "
                     "Esc: close)", id="models-help")
        yield OptionList(id="models")
        yield Static("", id="models-verdict")
        yield Input(placeholder="", id="models-input")
        yield Static("", id="models-status")

    def on_mount(self) -> None:
        self.query_one("#models-input", Input).display = False
        self.refresh_list()

    # ---- the list ------------------------------------------------------------------------------------------

    def _store(self):
        return Store(self.store_root) if self.store_root is not None else None

    def _serving_settings(self):
        """serving.toml's settings; None where there is none or it cannot be read (no default shown, the default
        context cap: the status line says what is wrong on use)."""
        try:
            return settings_file.load(ServingSettings, self.settings_path) if self.settings_path else None
        except Exception:
            return None

    def _default_path(self) -> str | None:
        settings = self._serving_settings()
        return settings.model if settings else None

    def refresh_list(self) -> None:
        listing = self.query_one("#models", OptionList)
        was = self.selected()
        listing.clear_options()
        store = self._store()
        if store is None:
            self.say("no model store on this console")
            return
        default = self._default_path()
        models = store.list()
        for m in models:
            mark = "*" if default and str(store.path_of(m).resolve()) == default else " "
            kind = f"embedding ({m.pooling})" if m.pooling else f"context {m.context_length:,}"
            pinned = "  pinned" if m.pinned else ""
            listing.add_option(Text(f"{mark} {m.name:32} {m.size / 2**20:9,.1f} MiB  {m.quantization:8} {kind}{pinned}"))
        self.names = [m.name for m in models]
        if models:  # the same model stays selected (else the first)
            listing.highlighted = self.names.index(was) if was in self.names else 0
        if not models:
            self.say("no models in the store: p pulls one (an http(s) URL or hf://OWNER/REPO/FILE.gguf)")
        elif not default:
            self.say("serving starts with the image's built-in model (* marks a store model it starts with)")

    # ---- the selected model's verdict: does it fit this box, at which context, how many sequences ------------

    def on_option_list_option_highlighted(self, event) -> None:
        name = self.selected()
        if name is None:
            return
        cached = self._verdicts.get(name)
        if cached:
            self.query_one("#models-verdict", Static).update(cached)
            return
        self.query_one("#models-verdict", Static).update(f"{name}: planning…")
        self.run_worker(lambda: self._judge(name), thread=True, exclusive=True, group="verdict")

    def _judge(self, name: str) -> None:
        """In a worker thread: the planner's verdict for a store model with the serving settings' context cap and
        the devices and free memory discovery last saw (the served model's own memory counts as used)."""
        try:
            store = self._store()
            text = verdict_for(str(store.path_of(store.get(name))), topology_file(self.run_dir),
                               self._context_cap() or DEFAULT_CTX).text
        except (StoreError, VerdictError, OSError) as exc:
            text = f"{name}: no verdict: {exc}"
        draw_from_worker(self, self._show_verdict, name, text)

    def _show_verdict(self, name: str, text: str) -> None:
        self._verdicts[name] = text
        if self.selected() == name:
            self.query_one("#models-verdict", Static).update(text)

    def _context_cap(self) -> int:
        settings = self._serving_settings()
        return settings.context_length if settings else 0

    def selected(self) -> str | None:
        index = self.query_one("#models", OptionList).highlighted
        names = getattr(self, "names", [])
        return names[index] if index is not None and 0 <= index < len(names) else None

    def say(self, text: str) -> None:
        self.query_one("#models-status", Static).update(text)

    # ---- actions --------------------------------------------------------------------------------------------

    def action_make_default(self) -> None:
        name = self.selected()
        if name is None or self.settings_path is None:
            self.say("select a model first")
            return

        def work():
            try:
                text = actions.set_default(self._store(), name, self.settings_path, runs=self.run_dir)
            except StoreError as exc:
                text = f"not changed: {exc}"
            draw_from_worker(self, self._done, text)

        self.say(f"making {name} the default…")
        self.run_worker(work, thread=True, group="models")

    def action_pin(self) -> None:
        """Pin (kept loaded once loaded, and from `rm`) or unpin the selected model, as `everycycle models pin`."""
        name = self.selected()
        if name is None:
            self.say("select a model first")
            return

        def job(store, say):
            pinned = not store.get(name).pinned
            store.set_pinned(name, pinned)
            return f"{name} {'pinned: kept loaded and from removal' if pinned else 'unpinned'}"

        self._run(job, f"changing {name}'s pin…")

    def action_remove(self) -> None:
        name = self.selected()
        if name is None:
            self.say("select a model first")
            return
        self._ask(f"remove:{name}", f"type {name} and Enter to remove it (anything else keeps it)")

    def action_pull(self) -> None:
        self._ask("pull", "a catalog name (qwen3:8b), hf://OWNER/REPO:QUANT or a URL, then Enter")

    def action_search(self) -> None:
        self._ask("search", "search the Hub's GGUF repositories for: (then Enter)")

    def _search(self, text: str) -> None:
        """In a worker thread: the Hub's GGUF repositories for `text`, each quantization's size, fit by size and
        the name `p` pulls it by (models/hub_search.py, as `everycycle models search`)."""
        from host_runtime.models.hub_search import search
        from host_runtime.placement.session import devices_from_topology, live_devices

        try:
            try:  # the devices and free memory discovery last saw, as the verdict above judges by
                devices, host = devices_from_topology(json.loads(topology_file(self.run_dir).read_text()))
            except (OSError, ValueError, KeyError, TypeError):
                devices, host = live_devices()
            room = host.available_bytes + sum(d.free_bytes for d in devices)
            found = search(text, 8)
        except (StoreError, OSError) as exc:
            draw_from_worker(self, self._show_found, f"searching the Hub for {text!r} failed: {exc}")
            return
        lines = [f"the Hub's GGUF repositories for {text!r} (room here {room / 2**30:.1f} GiB; p pulls a name):"]
        for repo, quants in found:
            lines.append(repo)
            for q in quants:
                size, fit, pull = q.row(room)
                lines.append(f"  {q.quant:8} {size:>10}  {fit:11} {pull}")
        if not found:
            lines.append("  nothing found")
        draw_from_worker(self, self._show_found, "\n".join(lines))

    def _show_found(self, text: str) -> None:
        self.query_one("#models-verdict", Static).update(text)
        self.say("search done: p pulls one of the names shown")

    def _ask(self, what: str, prompt: str) -> None:
        self._asking = what
        field = self.query_one("#models-input", Input)
        field.value, field.placeholder, field.display = "", prompt, True
        self.call_after_refresh(field.focus)  # a widget just shown takes the focus once it is laid out
        self.say(prompt)

    def on_input_submitted(self, event) -> None:
        what, self._asking = self._asking, None
        field = self.query_one("#models-input", Input)
        field.display = False
        self.query_one("#models", OptionList).focus()
        value = event.value.strip()
        if what and what.startswith("remove:"):
            name = what.split(":", 1)[1]
            if value != name:
                self.say(f"{name} kept")
                return
            # Typing its name is the confirmation: a pinned or loaded model goes too (unloaded first).
            self._run(lambda store, say: actions.remove(store, name, force=True, runs=self.run_dir, say=say),
                      f"removing {name}…")
        elif what == "search" and value:
            self.query_one("#models-verdict", Static).update(f"searching the Hub for {value!r}…")
            self.run_worker(lambda: self._search(value), thread=True, exclusive=True, group="verdict")
        elif what == "pull" and value:
            self._run(lambda store, say: f"pulled {pulling.pull(store, value, say=say).name}", f"pulling {value}…")

    def _run(self, job, starting: str) -> None:
        """A store job on a worker thread, its progress lines shown as they come, the list read again after."""
        def say(line: str) -> None:
            draw_from_worker(self, self.say, line)

        def work():
            try:
                text = job(self._store(), say)
            except StoreError as exc:
                text = f"failed: {exc}"
            draw_from_worker(self, self._done, text)

        self.say(starting)
        self.run_worker(work, thread=True, group="models")

    def _done(self, text: str) -> None:
        self.refresh_list()
        self.say(text)
