"""`everycycle bmc`: options, configuration file, and start-up. Errors name the option at fault."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

CONFIG_KEYS = {"backend", "host", "port", "user", "password_file", "listen", "period", "fan_curve", "fan_command"}


def add_arguments(p) -> None:
    p.add_argument("--backend", choices=["ipmi", "local"], help="ipmi: a BMC over LAN; local: hwmon, for boards without one")
    p.add_argument("--host", help="the BMC's address (ipmi)")
    p.add_argument("--port", type=int, default=None, help="the BMC's UDP port (default 623)")
    p.add_argument("--user", help="BMC user name (ipmi)")
    p.add_argument("--password-file", metavar="FILE", help="file holding the BMC password (mode 0600)")
    p.add_argument("--listen", metavar="HOST:PORT", help="where to serve /telemetry and /metrics (default 127.0.0.1:9290)")
    p.add_argument("--period", type=float, default=None, metavar="S", help="seconds between collections (default 5)")
    p.add_argument("--settings", metavar="FILE",
                   help="bmc.toml (written by provisioning from box.toml's [bmc]; defaults without it)")
    p.add_argument("--config", metavar="FILE", help="a JSON file with the same settings and fan policies "
                                                     "(it wins over --settings; command-line options win over both)")


def _settings(parser, args) -> dict:
    from agent_bmc.settings import BmcSettings
    from host_runtime.common.settings_file import SettingsError, load

    cfg: dict = {}
    try:
        if args.settings:
            cfg = load(BmcSettings, args.settings).as_config()
    except SettingsError as exc:
        parser.error(f"--settings: {exc}")
    if args.config:
        try:
            cfg.update(json.loads(Path(args.config).read_text()))
        except OSError as exc:
            parser.error(f"--config: cannot read {args.config}: {exc.strerror}")
        except ValueError as exc:
            parser.error(f"--config: {args.config} is not valid JSON: {exc}")
        unknown = set(cfg) - CONFIG_KEYS
        if unknown:
            parser.error(f"--config: unknown settings {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
    for key in ("backend", "host", "port", "user", "password_file", "listen", "period"):
        value = getattr(args, key)
        if value is not None:
            cfg[key] = value
    cfg.setdefault("listen", "127.0.0.1:9290")
    cfg.setdefault("period", 5.0)
    cfg.setdefault("port", 623)
    if cfg.get("backend") is None:
        parser.error("--backend: choose ipmi or local (or set 'backend' in --config)")
    return cfg


def read_password(parser, path: str) -> str:
    try:
        st = os.stat(path)
    except OSError as exc:
        parser.error(f"--password-file: cannot read {path}: {exc.strerror}")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        parser.error(f"--password-file: {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must be 0600")
    return Path(path).read_text().strip()


def run(parser, args) -> int:
    from agent_bmc.backends.ipmi import IpmiBackend
    from agent_bmc.backends.local import LocalBackend
    from agent_bmc.coordinator import Coordinator
    from agent_bmc.fan_curve import FanCurve, RawFanCommand
    from agent_bmc.server import AgentApplication

    cfg = _settings(parser, args)
    fan_curve = fan_command = None
    try:
        if cfg.get("fan_curve"):
            fan_curve = FanCurve(tuple((float(t), int(d)) for t, d in cfg["fan_curve"]))
        if cfg.get("fan_command"):
            fc = cfg["fan_command"]
            fan_command = RawFanCommand(int(str(fc["netfn"]), 0), int(str(fc["command"]), 0), fc["data"])
    except (ValueError, KeyError, TypeError) as exc:
        parser.error(f"--config: fan_curve/fan_command: {exc}")
    if cfg["backend"] == "ipmi":
        for key in ("host", "user", "password_file"):
            if not cfg.get(key):
                parser.error(f"--{key.replace('_', '-')}: required with --backend ipmi")
        backend = IpmiBackend(cfg["host"], int(cfg["port"]), cfg["user"], read_password(parser, cfg["password_file"]),
                              fan_command)
    else:
        backend = LocalBackend()
    if ":" not in cfg["listen"]:
        parser.error(f"--listen: expected HOST:PORT, got {cfg['listen']!r}")
    coordinator = Coordinator(backend, period_s=float(cfg["period"]), deadline_s=max(2.0, float(cfg["period"]) * 1.5),
                              fan_curve=fan_curve)
    print(f"everycycle bmc: {backend.name} backend, serving http://{cfg['listen']}/telemetry", file=sys.stderr)
    AgentApplication(coordinator, cfg["listen"]).run()
    return 0
