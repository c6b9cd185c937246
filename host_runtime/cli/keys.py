"""`everycycle keys`: the API keys, their limits and their usage."""

from __future__ import annotations

import os
import sys


def cmd_keys(parser, args) -> int:
    from host_runtime.auth.keystore import KeyStoreError, create_key, load_keys, revoke_key

    try:
        if args.keys_command == "create":
            limits = _key_limits(args)
            key = create_key(args.keys, args.name, args.priority)
            if any(v for v in limits.values()):
                from host_runtime.auth.keystore import set_limit

                set_limit(args.keys, args.name, **limits)
            print(key)
            print(f"stored the hash of key {args.name!r} in {args.keys}; this is the only time the key is shown",
                  file=sys.stderr)
        elif args.keys_command == "set-limit":
            from host_runtime.auth.keystore import set_limit

            set_limit(args.keys, args.name, **_key_limits(args))
            policy = next(k for k in load_keys(args.keys) if k.name == args.name)
            print(f"key {args.name!r}: {_limits_text(policy)}", file=sys.stderr)
        elif args.keys_command == "set-priority":
            from host_runtime.auth.keystore import set_priority

            set_priority(args.keys, args.name, args.priority)
            print(f"key {args.name!r} is now of class {args.priority}", file=sys.stderr)
        elif args.keys_command == "revoke":
            if not revoke_key(args.keys, args.name) and not args.missing_ok:
                print(f"everycycle keys: no key named {args.name!r} in {args.keys}", file=sys.stderr)
                return 2
        elif args.keys_command == "import":
            from host_runtime.auth.keystore import store_key
            from host_runtime.common.settings_file import SettingsError
            from host_runtime.fleet.settings import read_key

            try:
                key = read_key(args.key_file)
            except SettingsError as exc:
                print(f"everycycle keys: --key-file: {exc.message}", file=sys.stderr)
                return 2
            store_key(args.keys, args.name, key, gateway=args.gateway)
            print(f"stored the hash of key {args.name!r} in {args.keys}"
                  + (", with the seed that vouches for clients' keys to the fleet's boxes" if args.gateway else ""),
                  file=sys.stderr)
        elif args.keys_command == "usage":
            return _keys_usage(args)
        else:
            for k in load_keys(args.keys):
                print(f"{k.name}\t{k.hint}\t{k.priority}\t{_limits_text(k)}")
            return 0
    except KeyStoreError as exc:
        print(f"everycycle keys: {exc}", file=sys.stderr)
        return 2
    from host_runtime.auth.carried_keys import refresh_carried

    try:
        if refresh_carried(args.keys):
            print("the update waiting for a reboot carries this change too", file=sys.stderr)
    except OSError as exc:
        print(f"everycycle keys: the change is made, but the copy an update waiting for a reboot carries could not "
              f"be taken again ({exc.strerror}): run this as root, or the next slot brings back the old keys",
              file=sys.stderr)
        return 1
    return 0


def _key_limits(args) -> dict:
    def listed(text):
        return None if text is None else tuple(m.strip() for m in text.split(",") if m.strip())

    return {"max_concurrent": args.max_concurrent, "tokens_per_minute": args.tokens_per_minute,
            "tokens_per_day": args.tokens_per_day, "models": listed(args.models),
            "allowed_from": listed(args.allowed_from),
            "may_pull": None if args.may_pull is None else args.may_pull == "yes"}


def _limits_text(k) -> str:
    parts = [f"{k.max_concurrent} at once" if k.max_concurrent else "",
             f"{k.tokens_per_minute:,} tokens/min" if k.tokens_per_minute else "",
             f"{k.tokens_per_day:,} tokens/day" if k.tokens_per_day else "",
             f"models {','.join(k.models)}" if k.models else "",
             f"from {','.join(k.allowed_from)}" if k.allowed_from else "",
             "may pull models" if k.may_pull else ""]
    return ", ".join(p for p in parts if p) or "no limit"


def _keys_usage(args) -> int:
    import json as json_module

    from host_runtime.engine import usage_file

    directory = args.usage_dir or os.environ.get("EVERYCYCLE_USAGE_DIR") or "/var/lib/everycycle/usage"
    usage = usage_file.read_all(directory)
    if args.json:
        print(json_module.dumps(usage, indent=2, sort_keys=True))
        return 0
    if not usage:
        print(f"no usage recorded in {directory}")
        return 0
    print(f"{'KEY':24} {'REQUESTS':>9} {'PROMPT':>12} {'CACHED':>12} {'GENERATED':>12} {'ERRORS':>7}")
    for key, c in sorted(usage.items(), key=lambda kv: -(kv[1].get("key_prompt_tokens_total", 0)
                                                        + kv[1].get("key_generated_tokens_total", 0))):
        print(f"{key:24} {c.get('key_requests_total', 0):9,.0f} {c.get('key_prompt_tokens_total', 0):12,.0f} "
              f"{c.get('key_cached_prompt_tokens_total', 0):12,.0f} {c.get('key_generated_tokens_total', 0):12,.0f} "
              f"{c.get('key_errors_total', 0):7,.0f}")
    return 0
