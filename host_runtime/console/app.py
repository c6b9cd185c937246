"""The dashboard on tty1 (textual). It only draws what the data layer read; reads run in a worker thread."""

from __future__ import annotations

import time
from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Sparkline, Static

from host_runtime.auth import admin_passphrase, factory_reset
from host_runtime.auth.factory_reset import describe
from host_runtime.auth.new_keys import forget_new_keys, read_new_keys
from host_runtime.box_status.reader import StatusReader
from host_runtime.box_status.rows import BoxStatus
from host_runtime.common.run_layout import supervisor_socket, topology_file
from host_runtime.common.supervisor_rpc import restart_service
from host_runtime.console.connect import connect_lines
from host_runtime.console.from_worker import draw_from_worker
from host_runtime.console.models_screen import Models
from host_runtime.console.status_text import fmt, model_lines, system_line, users_line
from host_runtime.console.terminal import TerminalWatch
from host_runtime.console.wizard import Wizard, configurable_links

HEALTH_STYLE = {"ok": "green", "warning": "yellow", "critical": "bold red", "failed": "bold red"}
STATE_STYLE = {"idle": "green", "controlling": "cyan", "recovering": "yellow", "emergency": "bold red",
               "failsafe": "bold red"}


def bar(value: float | None, limit: float | None, width: int = 20) -> str:
    if not value or not limit:
        return "·" * width
    filled = max(0, min(width, round(width * value / limit)))
    return "█" * filled + "·" * (width - filled)


class GpuDetails(ModalScreen):
    BINDINGS = [Binding("escape", "app.pop_screen", "close")]

    def __init__(self, gpus: list[dict]):
        super().__init__()
        self.gpus = gpus

    def compose(self) -> ComposeResult:
        body = Text("GPU details (Esc to close)\n\n", style="bold")
        for g in self.gpus or [{"name": "no GPUs reported by the governor"}]:
            body.append(f"{g.get('name')}\n", style="bold")
            for key in ("id", "temperature_c", "power_w", "applied_limit_w", "decided_limit_w", "target_c", "state",
                        "vram_used_bytes", "vram_total_bytes", "min_w", "max_w", "default_w"):
                if key in g:
                    body.append(f"  {key:<16} {g[key]}\n")
        yield Static(body, id="gpu-details")


class Connect(ModalScreen):
    """How to point a client at this box: its address, trusting its certificate, the tools' settings."""
    BINDINGS = [Binding("escape", "app.pop_screen", "close")]

    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines

    def compose(self) -> ComposeResult:
        body = Text("Connect a client (Esc to close)\n\n", style="bold")
        body.append("\n".join(self.lines))
        yield Static(body, id="connect")


class NewKeys(ModalScreen):
    """First boot's API keys, on this screen only and only once: closing it forgets them."""
    BINDINGS = [Binding("enter", "done", "I have written them down"), Binding("escape", "done", "close")]

    def __init__(self, keys: dict[str, str], path: Path):
        super().__init__()
        self.keys = keys
        self.path = path

    def compose(self) -> ComposeResult:
        body = Text("New API keys (shown only now: write them down, then press Enter)\n\n", style="bold")
        for name, key in self.keys.items():
            body.append(f"  {name}: ")
            body.append(f"{key}\n", style="bold yellow")
        body.append("\nOnly their hashes are kept on the box; a lost key is replaced with 'everycycle keys create'.")
        yield Static(body, id="new-keys")

    def action_done(self) -> None:
        forget_new_keys(self.path)
        self.app.pop_screen()


class AdminPassphrase(ModalScreen):
    """Asked before the wizard reopens or a reset erases a provisioned box: whoever is at the keyboard is not yet
    the owner."""
    BINDINGS = [Binding("escape", "app.pop_screen", "cancel")]

    def __init__(self, purpose: str = "the wizard"):
        super().__init__()
        self.purpose = purpose

    def compose(self) -> ComposeResult:
        from textual.widgets import Input

        yield Static(f"The box is set up: {self.purpose} needs the admin passphrase (Esc cancels).",
                     id="passphrase-help")
        yield Input(placeholder="admin passphrase", password=True, id="passphrase")

    def on_input_submitted(self, event) -> None:
        self.dismiss(event.value)


class FactoryReset(ModalScreen):
    """Says what it erases; typing 'erase' does it."""
    BINDINGS = [Binding("escape", "app.pop_screen", "cancel")]

    def compose(self) -> ComposeResult:
        from textual.widgets import Input

        yield Static(describe() + "\nType 'erase' and Enter to reset this box, Esc to leave it as it is.",
                     id="reset-help")
        yield Input(placeholder="erase", id="confirm")

    def on_input_submitted(self, event) -> None:
        self.dismiss(event.value.strip() == "erase")


class Dashboard(App):
    CSS = """
    Screen { layout: vertical; }
    #header { height: 3; padding: 0 1; background: $boost; }
    #panels { grid-size: 2 2; grid-gutter: 0 1; height: 1fr; }
    .panel { border: round $primary; padding: 0 1; height: 100%; }
    #tokens { height: 3; }
    #notice { height: 1; padding: 0 1; }
    """
    BINDINGS = [Binding("r", "restart_serving", "restart serving"), Binding("k", "key_hint", "API key hint"),
                Binding("c", "connect", "connect a client"), Binding("m", "models", "models"),
                Binding("g", "gpu_details", "GPU details"), Binding("w", "wizard", "set-up wizard"),
                Binding("F", "factory_reset", "factory reset"),
                Binding("q", "quit_console", "quit")]

    def __init__(self, reader: StatusReader, tick_s: float = 2.0, allow_quit: bool = False,
                 watch_terminal: bool = False):
        super().__init__()
        self.reader = reader
        self.tick_s = tick_s
        self.allow_quit = allow_quit
        # On a real terminal (cmd_console): end when it goes away (console/terminal.py). Not under the pilot.
        self.watch_terminal = watch_terminal
        self.status: BoxStatus | None = None
        self.reads = 0

    def compose(self) -> ComposeResult:
        yield Static("starting…", id="header")
        with Grid(id="panels"):
            with Vertical(classes="panel", id="serving-panel"):
                yield Static("", id="serving")
                yield Sparkline([], id="tokens")
            yield Static("", id="gpus", classes="panel")
            yield Static("", id="chassis", classes="panel")
            yield Static("", id="events", classes="panel")
        yield Static("", id="notice")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#serving-panel").border_title = "Serving"
        for pid, title in (("gpus", "GPUs"), ("chassis", "Chassis"), ("events", "Events")):
            self.query_one(f"#{pid}").border_title = title
        self.refresh_data()
        self.set_interval(self.tick_s, self.refresh_data)
        if self.watch_terminal:
            TerminalWatch(self).start()
        if hasattr(self.reader, "provisioned") and self.reader.provisioned() is None:
            self.action_wizard()  # first boot with no bundle: set the box up before anything else
        self.show_new_keys()

    def show_new_keys(self) -> None:
        path = getattr(getattr(self.reader, "config", None), "new_keys_file", None)
        if path is None:
            return

        keys = read_new_keys(path)
        if keys:
            self.push_screen(NewKeys(keys, path))

    def refresh_data(self) -> None:
        self.run_worker(self._read, thread=True, exclusive=True, group="read")

    def _read(self) -> None:
        status = self.reader.read()
        draw_from_worker(self, self.show, status)

    # ---- drawing ---------------------------------------------------------------------

    def show(self, s: BoxStatus) -> None:
        self.status = s
        self.reads += 1
        header = Text(f"{s.box_name}", style="bold")
        header.append(f"   EveryCycle {s.version}   up {s.uptime_s / 3600:.1f} h\n")
        header.append("API  " + "   ".join(s.api_urls), style="bold cyan")
        if s.tls_fingerprint:
            header.append(f"\nTLS  SHA-256 {s.tls_fingerprint}")
        if line := system_line(s.system):
            header.append(f"\n{line}")
        self.query_one("#header", Static).update(header)

        sv = s.serving
        t = Text()
        if not sv.source.ok:
            t.append("DOWN\n", style="bold red")
            t.append(sv.source.detail)
        else:
            t.append(f"{sv.model or '?'}\n", style="bold")
            t.append("ready" if sv.ready else "NOT READY", style="green" if sv.ready else "bold red")
            t.append(f"  {sv.ready_reason}\n")
            t.append(f"{sv.running:.0f} running, {sv.waiting:.0f} waiting\n")
            t.append(f"{fmt(sv.tokens_per_s, '.1f')} tok/s   TTFT p50 "
                     f"{fmt(sv.ttft_p50_s and sv.ttft_p50_s * 1000, '.0f')} ms   prefix hits "
                     f"{fmt(sv.prefix_hit_ratio and sv.prefix_hit_ratio * 100, '.0f')} %")
            if sv.backend:
                t.append(f"\n{sv.backend.get('backend')} on {sv.backend.get('device')}: "
                         + ", ".join(f"{d} {n}" for d, n in sv.layers.items()) + " layers")
            for line in model_lines(sv):
                t.append(f"\n{line}", style="yellow" if line.startswith("pulling") else "")
            if users_line(sv):
                t.append(f"\n{users_line(sv)}")
        self.query_one("#serving", Static).update(t)
        self.query_one("#tokens", Sparkline).data = s.token_history or [0.0]

        g = Text()
        if not s.governor.ok:
            g.append(f"governor: {s.governor.detail}\n", style="yellow")
        for gpu in s.gpus:
            g.append(f"{gpu['name']}\n", style="bold")
            g.append(f" {fmt(gpu.get('temperature_c'), '5.1f')} C  ")
            g.append(f"{bar(gpu.get('power_w'), gpu.get('applied_limit_w'))} ")
            g.append(f"{fmt(gpu.get('power_w'), '.0f')}/{fmt(gpu.get('applied_limit_w'), '.0f')} W  ")
            g.append(f"target {fmt(gpu.get('target_c'), '.0f')} C ")
            g.append(str(gpu.get("state")), style=STATE_STYLE.get(gpu.get("state"), ""))
            if gpu.get("vram_total_bytes"):
                g.append(f"  VRAM {gpu.get('vram_used_bytes', 0) / 2**30:.1f}/{gpu['vram_total_bytes'] / 2**30:.0f} GiB")
            g.append("\n")
        g.append(f"CPU {s.cpu_percent:.0f} %   RAM {s.ram_used_percent:.0f} %   throttle {fmt(s.throttle_level)}")
        self.query_one("#gpus", Static).update(g)

        c = Text()
        if not s.chassis:
            c.append(s.bmc.detail if s.bmc.detail else "no BMC", style="yellow" if not s.bmc.ok else "")
        else:
            if not s.bmc.ok:
                c.append(f"{s.bmc.detail}\n", style="yellow")
            for sensor in s.chassis:
                c.append(f"{sensor['name']:<16} {fmt(sensor.get('value'))} {sensor.get('units', '')} ")
                c.append(f"{sensor.get('health')}\n", style=HEALTH_STYLE.get(sensor.get("health"), ""))
        services = "  ".join(f"{k}:{v}" for k, v in sorted(s.services.items())) if s.supervisor.ok else \
            f"services: {s.supervisor.detail}"
        c.append("\n" + services)
        self.query_one("#chassis", Static).update(c)

        e = Text()
        for ev in s.events[:12]:
            at = str(ev["at"])
            clock = at.split("T", 1)[1][:8] if "T" in at else at[-8:]  # ISO stamps and plain clock times alike
            e.append(f"{clock} {ev['source']:<8} {ev['detail']}\n")
        self.query_one("#events", Static).update(e or Text("no events yet"))

    # ---- keys ------------------------------------------------------------------------

    def notice(self, text: str) -> None:
        self.query_one("#notice", Static).update(text)

    def action_key_hint(self) -> None:
        self.notice("API keys: " + self.reader.key_hint())

    def action_restart_serving(self) -> None:
        def restart():
            try:
                text = restart_service(supervisor_socket(self.reader.config.run_dir), "serving")
            except Exception as exc:
                text = f"could not restart serving: {exc}"
            draw_from_worker(self, self.notice, text)

        self.notice("restarting serving…")
        self.run_worker(restart, thread=True, group="restart")

    def _passphrase_then(self, then, purpose: str) -> None:
        """Ask for the admin passphrase and call `then()` when it is right; wrong ones count on disk, so a
        restarted console gives no fresh tries."""
        root = self.reader.config.provision_root
        wait = admin_passphrase.locked_for(root, time.time())
        if wait:
            self.notice(f"too many wrong passphrases: try again in {wait:.0f} s")
            return

        def checked(passphrase: str | None) -> None:
            if passphrase is None:
                return
            if admin_passphrase.attempt(root, passphrase, time.time()):
                then()
            else:
                self.notice(f"wrong admin passphrase: {purpose} refused")

        self.push_screen(AdminPassphrase(purpose), checked)

    def action_wizard(self) -> None:
        """First boot: the wizard at once. Provisioned: only with the admin passphrase."""
        provisioned = getattr(self.reader, "provisioned", lambda: None)() is not None
        if not provisioned:
            self.open_wizard()
            return
        if admin_passphrase.stored(self.reader.config.provision_root) is None:
            self.notice("the wizard is locked: this box was set up without an admin passphrase (F: factory reset)")
            return
        self._passphrase_then(self.open_wizard, "the wizard")

    def action_factory_reset(self) -> None:
        """The passphrase, or where there is none the presence token on the boot disk; then 'erase'."""
        cfg = self.reader.config
        if factory_reset.proof_needed(cfg.provision_root) == "passphrase":
            self._passphrase_then(self._confirm_reset, "the factory reset")
        elif factory_reset.presence_shown(cfg.bundle_dir):
            self._confirm_reset()
        else:
            self.notice("factory reset: " + factory_reset.how_to_show_presence(cfg.bundle_dir))

    def _confirm_reset(self) -> None:
        from host_runtime.auth.factory_reset import factory_reset

        def confirmed(yes: bool | None) -> None:
            if not yes:
                self.notice("factory reset cancelled: nothing was erased")
                return
            cfg = self.reader.config
            gone = factory_reset(cfg.provision_root, cfg.bundle_dir)
            self.notice(f"factory reset: erased {len(gone)} files; set the box up again")
            self._restart_quietly()  # serving drops the prompts its RAM cache holds and the old settings
            self.open_wizard()

        self.push_screen(FactoryReset(), confirmed)

    def _restart_quietly(self) -> None:
        def restart():
            try:
                restart_service(supervisor_socket(self.reader.config.run_dir), "serving")
            except Exception:
                pass  # nothing running (first boot, a test): nothing holds the old state

        self.run_worker(restart, thread=True, group="restart")

    def open_wizard(self) -> None:
        import psutil

        topo = self.reader.topology() if hasattr(self.reader, "topology") else None
        links = configurable_links((topo or {}).get("network"))
        memory = ((topo or {}).get("memory") or {}).get("total_bytes") or psutil.virtual_memory().total
        cfg = self.reader.config
        self.push_screen(Wizard(links, memory, cfg.bundle_dir, cfg.provision_root, topology_file(cfg.run_dir)))

    def on_provisioned(self, result) -> None:
        self.notice(f"provisioned (bundle {result.digest[:12]}); Esc returns to the dashboard")

    def action_models(self) -> None:
        cfg = self.reader.config
        self.push_screen(Models(cfg.model_store, cfg.serving_settings, cfg.run_dir))

    def action_connect(self) -> None:
        status = self.status
        self.push_screen(Connect(connect_lines(status.api_urls if status else [],
                                               status.tls_fingerprint if status else None,
                                               self.reader.config.tls_anchor)))

    def action_gpu_details(self) -> None:
        self.push_screen(GpuDetails(self.status.gpus if self.status else []))

    def action_quit_console(self) -> None:
        if self.allow_quit:
            self.exit()
        else:
            self.notice("quitting to a shell is not enabled on this box")
