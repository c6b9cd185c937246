"""`everycycle`: one entry point, a subcommand per service of the box; a module of this package per
subcommand (or a few alike), the parser in parser.py."""

from __future__ import annotations

import logging
import sys

from host_runtime.common.errors import EveryCycleError, InputError, UnavailableError
from host_runtime.cli.box import cmd_bmc, cmd_console, cmd_discover, cmd_governor, cmd_provision
from host_runtime.cli.fleet import cmd_fleet
from host_runtime.cli.front import cmd_front
from host_runtime.cli.keys import cmd_keys
from host_runtime.cli.parser import build_parser
from host_runtime.cli.serve import cmd_engine, cmd_plan, cmd_serve, engine_options, serve_arguments

# What other modules and the tests take from the CLI by its package's name.
__all__ = ["EXIT_CODES", "build_parser", "engine_options", "exit_code", "main", "serve_arguments"]


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def cmd_models(parser, args) -> int:
    from host_runtime.admin.models_cli import run

    return run(parser, args)


def cmd_update(parser, args) -> int:
    from host_runtime.update.cli import run

    return run(parser, args)


def cmd_measure(parser, args) -> int:
    from host_runtime.measure.cli import run

    return run(parser, args)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging()
    if args.command in ("serve", "engine", "plan", "discover"):
        # Before anything imports llama_cpp: which llama.cpp build this process and its engines load.
        from host_runtime.gpu.llama_build import load_first, select

        select()
        if args.command == "plan":  # it loads a model: llama.cpp's libraries before numpy's (engine: cmd_engine,
            load_first()          # once it knows its model is not a Whisper model, which never loads llama.cpp)
    handlers = {"serve": cmd_serve, "engine": cmd_engine, "plan": cmd_plan, "keys": cmd_keys, "discover": cmd_discover,
                "governor": cmd_governor, "console": cmd_console, "status": cmd_console, "provision": cmd_provision,
                "bmc": cmd_bmc, "front": cmd_front, "update": cmd_update,
                "models": cmd_models, "fleet": cmd_fleet, "measure": cmd_measure}
    try:
        return handlers[args.command](parser, args)
    except KeyboardInterrupt:
        return 130
    except EveryCycleError as exc:  # one no handler said in its own words: its message, its family's code
        print(f"everycycle {args.command}: {exc}", file=sys.stderr)
        return exit_code(exc)


# The box's error families, mapped once to exit codes (common/errors.py): 2 as argparse's for input that cannot be
# used, 69 (sysexits' EX_UNAVAILABLE) for a part not answering now, 1 for the rest.
EXIT_CODES = ((InputError, 2), (UnavailableError, 69), (EveryCycleError, 1))


def exit_code(exc: EveryCycleError) -> int:
    return next(code for family, code in EXIT_CODES if isinstance(exc, family))

