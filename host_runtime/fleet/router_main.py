"""The fleet router's process: sglang-router, started with its control-plane key read from the environment.

Started so (router_process.argv) rather than as `sglang_router.launch_router` with the key among its arguments:
a process's command line is readable by every local user (/proc/PID/cmdline, ps), its environment only by its
own user. With the key, the router's control plane (/workers, /v1/tokenizers) answers 401 to anyone but the
gateway's controller, which made the key; its inference routes stay open to the gateway's front, which checks
the client's key first and passes only the inference routes (front/nginx_conf.py).
"""

from __future__ import annotations

import os
import sys

from host_runtime.fleet.router_process import ADMIN_KEY_ENV, control_plane_key_arg


def main(argv: list[str] | None = None) -> None:
    key = os.environ.pop(ADMIN_KEY_ENV, "")
    if not key:
        sys.exit(f"everycycle fleet router: {ADMIN_KEY_ENV} is not set; the gateway starts the router with it")
    from sglang_router.launch_router import launch_router, parse_router_args

    launch_router(parse_router_args([*(sys.argv[1:] if argv is None else argv), *control_plane_key_arg(key)]))


if __name__ == "__main__":
    main()
