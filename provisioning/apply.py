"""Applying a bundle: validate, stage every file, (optionally) configure the running network, then move
everything into place; any failure restores what was there. Re-applying the same bundle changes nothing."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import ipaddress
import json
import os
import secrets as pysecrets
import shutil
import socket
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from host_runtime.common.errors import InputError
from host_runtime.auth.keystore import FILE_VERSION, fleet_vouch_fields, hash_key, key_hint
from host_runtime.common import settings_file
from host_runtime.common.atomic_file import atomic_write
from host_runtime.common.service_user import owner_of, service_owner
from host_runtime.fleet.settings import (BOX_KEY_FILE, BOX_PEER_CERT_DIR, BOX_SHARD_HOLDER_KEYS, BOX_SHARD_WIRE_KEY,
                                         box_peer_certificate,
                                         process_environment as fleet_process_environment)
from host_runtime.front.settings import box_gateway_addresses
from host_runtime.governor.settings import process_environment
from host_runtime.models.store import Store, StoreError
from host_runtime.shard.wire_key import secrets_text
from provisioning.bundle import MAX_MODEL_BYTES, Bundle, BundleError, StagedCopy
from provisioning.service_settings import MODELS_DIR, service_settings
from provisioning.signing import manifest, verify
from provisioning.validate import FLEET_KEY_NAME, SECRET_FIELDS, field_value, validate

FLEET_KEY = BOX_KEY_FILE.lstrip("/")
SHARD_WIRE_KEY, SHARD_HOLDER_KEYS = BOX_SHARD_WIRE_KEY.lstrip("/"), BOX_SHARD_HOLDER_KEYS.lstrip("/")
# Secrets the unprivileged services read, each owned by the one that reads it (common/service_user.py: serving the
# keys, the front the TLS key, the BMC agent its password, the fleet program the fleet key, a shard host its wire key,
# serving its shard hosts').
SERVICE_READ_FILES = ("etc/everycycle/api_keys.json", "etc/everycycle/tls/api.key", "etc/everycycle/bmc.password",
                      FLEET_KEY, SHARD_WIRE_KEY, SHARD_HOLDER_KEYS)


class BundleInvalid(InputError):
    def __init__(self, errors: list[BundleError]):
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


@dataclass
class ApplyResult:
    changed: bool
    digest: str
    record: Path
    generated_keys: dict[str, str] = field(default_factory=dict)  # shown once, stored only as hashes
    removed_secrets: list[str] = field(default_factory=list)


def digest_of(bundle: Bundle) -> str:
    return hashlib.sha256(manifest(bundle)).hexdigest()


def _networkd(iface: dict) -> str:
    lines = ["# Written by everycycle provision apply", "[Match]", f"Name={iface['name']}", "", "[Network]"]
    if iface["mode"] == "dhcp":
        lines.append("DHCP=yes")
    else:
        lines.append(f"Address={iface['address']}")
        if iface.get("gateway"):
            lines.append(f"Gateway={iface['gateway']}")
    lines += [f"DNS={d}" for d in iface.get("dns", [])]
    return "\n".join(lines) + "\n"


def plan_files(bundle: Bundle, generated: dict[str, str], existing_keys: list[dict] = ()) -> dict[str, tuple]:
    """Every file apply writes, relative to the root: contents (bytes, or the model's StagedCopy) and mode.

    Keys already on the box (made there with `everycycle keys create`, or by an earlier bundle) stay unless the
    bundle names a key of the same name: re-provisioning never silently revokes a key."""
    box = bundle.box
    api = box.get("api", {})
    keys = [{"name": k["name"], "sha256": k["sha256"], "hint": "provisioned", "created": 0} for k in api.get("keys", [])]
    keys += [{"name": n, "sha256": hash_key(k), "hint": key_hint(k), "created": 0} for n, k in generated.items()]
    fleet = box.get("fleet", {})
    fleet_key = bundle.read(fleet["key_file"]).decode().strip() if fleet.get("key_file") else None
    if fleet_key:
        # A member is valid for the fleet key from its gateway's address alone (both gateways' with two), where
        # box.toml names it.
        allowed = box_gateway_addresses(fleet) if fleet.get("role") == "member" else []
        # Every box keeps the public key that checks the gateway's vouchers for clients' keys, the gateway alone
        # the seed that signs them (auth/fleet_vouch.py).
        keys.append({"name": FLEET_KEY_NAME, "sha256": hash_key(fleet_key), "hint": FLEET_KEY_NAME, "created": 0,
                     "allowed_from": allowed, **fleet_vouch_fields(fleet_key, fleet.get("role") == "gateway")})
    named = {k["name"] for k in keys}
    # A box that leaves its fleet stops accepting the fleet key (only the one provisioning put there).
    keys = [k for k in existing_keys if isinstance(k, dict) and k.get("name") not in named
            and not (k.get("name") == FLEET_KEY_NAME and k.get("hint") == FLEET_KEY_NAME)] + keys
    # [api.policies]: each key's limits and class, by name, as `everycycle keys` would set them.
    policies = api.get("policies", {})
    keys = [{**k, **policies[k["name"]]} if k.get("name") in policies else k for k in keys]
    files = {
        # root's alone: it holds the API keys' hashes (the services read their own settings files, not this).
        "etc/everycycle/box.toml": (bundle.raw_toml, 0o600),
        "etc/everycycle/api_keys.json": (json.dumps({"version": FILE_VERSION, "keys": keys}, indent=2).encode(), 0o600),
        "etc/hostname": (box["hostname"].encode() + b"\n", 0o644),
    }
    for iface in box["network"]["interfaces"]:
        files[f"etc/systemd/network/10-everycycle-{iface['name']}.network"] = (_networkd(iface).encode(), 0o644)
    if box.get("ssh", {}).get("authorized_keys"):
        files["root/.ssh/authorized_keys"] = (bundle.read(box["ssh"]["authorized_keys"]), 0o600)
    if api.get("tls_certificate"):
        files["etc/everycycle/tls/api.crt"] = (bundle.read(api["tls_certificate"]), 0o644)
    if api.get("tls_key"):
        files["etc/everycycle/tls/api.key"] = (bundle.read(api["tls_key"]), 0o600)
    if fleet_key and fleet.get("role") == "gateway":
        # Only the gateway uses the key (its router's credential at every box); a member keeps its hash alone,
        # so a compromised member holds nothing that opens the others.
        files[FLEET_KEY] = (fleet_key.encode() + b"\n", 0o600)
    for i, rel in enumerate(fleet.get("peer_certificates", [])):
        files[box_peer_certificate(i).lstrip("/")] = (bundle.read(rel), 0o644)
    # A shard host keeps its own wire key, a holder one for each of its shard hosts: each opens only those wires
    # (shard/wire_key.py), and neither is the fleet key.
    if fleet_key and fleet.get("shard_listen"):
        files[SHARD_WIRE_KEY] = (secrets_text(fleet_key, [fleet["shard_listen"]]).encode(), 0o600)
    if fleet_key and fleet.get("shard_hosts"):
        files[SHARD_HOLDER_KEYS] = (secrets_text(fleet_key, fleet["shard_hosts"]).encode(), 0o600)
    bmc = box["bmc"]
    if bmc["mode"] == "ipmi":
        files["etc/everycycle/bmc.password"] = (bundle.read(bmc["password_file"]), 0o600)
    model = box["model"]
    if model["source"] == "bundle":
        name = Path(model["path"]).name
        files[f"{MODELS_DIR}/{name}"] = (bundle.copy_out(model["path"], MAX_MODEL_BYTES), 0o644)  # streamed
    # Each service's settings through its own typed writer (the service's parser reads the same structure):
    # no value from the bundle reaches a command line or an environment file.
    settings_by_file = service_settings(box)
    for rel, settings in settings_by_file.items():
        files[rel] = (settings_file.dump(settings), 0o644)
    files["etc/everycycle/governor.env"] = (process_environment(settings_by_file["etc/everycycle/governor.toml"]), 0o644)
    files["etc/everycycle/fleet-address.env"] = (fleet_process_environment(settings_by_file["etc/everycycle/fleet.toml"]),
                                                 0o644)
    return files


def apply_network_live(interfaces: list[dict], link_wait_s: float = 0.0) -> list:
    """Static addresses and default routes on the running system (pyroute2); returns what to undo.

    At first boot a NIC may still be on its way (driver probe, udev renaming it): each named link
    gets up to `link_wait_s` to appear. A refusal from the kernel (no CAP_NET_ADMIN, an address in
    use) undoes what was done and becomes a BundleError naming the interface."""
    from pyroute2 import IPRoute
    from pyroute2.netlink.exceptions import NetlinkError

    undo = []
    deadline = time.monotonic() + link_wait_s
    with IPRoute() as ipr:
        for i, iface in enumerate(interfaces):
            found = ipr.link_lookup(ifname=iface["name"])
            while not found and time.monotonic() < deadline:
                time.sleep(0.25)
                found = ipr.link_lookup(ifname=iface["name"])
            if not found:
                _undo_live(undo)
                raise BundleError(f"network.interfaces[{i}].name", f"there is no interface {iface['name']!r} on this box")
            if iface["mode"] != "static":
                continue  # DHCP is systemd-networkd's, from the files written below
            idx = found[0]
            net = ipaddress.ip_interface(iface["address"])
            try:
                ipr.link("set", index=idx, state="up")
                present = {(a.get_attr("IFA_ADDRESS"), a["prefixlen"]) for a in ipr.get_addr(index=idx)}
                if (str(net.ip), net.network.prefixlen) not in present:
                    ipr.addr("add", index=idx, address=str(net.ip), prefixlen=net.network.prefixlen)
                    undo.append(("addr", idx, str(net.ip), net.network.prefixlen))
                if iface.get("gateway"):
                    ipr.route("replace", dst="default", gateway=iface["gateway"], oif=idx)
            except NetlinkError as exc:
                _undo_live(undo)
                raise BundleError(f"network.interfaces[{i}]",
                                  f"could not configure {iface['name']}: {os.strerror(exc.code)}") from None
    return undo


def apply_hostname_live(hostname: str) -> list:
    """The new hostname on the running system too (systemd read /etc/hostname before first boot ran)."""
    old = socket.gethostname()
    if old == hostname:
        return []
    try:
        socket.sethostname(hostname)
    except OSError as exc:
        raise BundleError("hostname", f"could not set the hostname: {exc.strerror}") from None
    return [("hostname", old)]


def _undo_live(undo: list) -> None:
    """Put back what the live steps changed: addresses, then the hostname."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for kind, *what in reversed(undo):
            try:
                if kind == "addr":
                    idx, address, prefixlen = what
                    ipr.addr("del", index=idx, address=address, prefixlen=prefixlen)
                elif kind == "hostname":
                    socket.sethostname(what[0])
            except Exception:
                pass


def apply(bundle: Bundle, root: Path = Path("/"), live_network: bool = False,
          require_signature_pem: bytes | None = None, link_wait_s: float = 0.0) -> ApplyResult:
    state = root / "var/lib/everycycle"
    record_path = state / "provisioned.json"
    # The digest covers box.toml and every declared file's hash: the same bundle is recognised even after
    # its secrets were removed from it by the first apply, and changes nothing.
    digest = digest_of(bundle)
    try:
        previous = json.loads(record_path.read_text())
    except (OSError, ValueError):
        previous = None
    if previous and previous.get("digest") == digest:
        if require_signature_pem is not None:
            try:
                verify(bundle, require_signature_pem)
            except BundleError as exc:
                raise BundleInvalid([exc]) from None
        return ApplyResult(False, digest, record_path)
    if bundle.staging_parent is None:
        bundle.staging_parent = root / MODELS_DIR  # the model's copy lands where it is installed: one rename
    try:
        return _apply_checked(bundle, root, live_network, require_signature_pem, link_wait_s, digest, previous,
                              record_path)
    finally:
        bundle.drop_copies()  # a model copy apply did not install (a refused bundle, a failure) goes


def _store_model_errors(root: Path, name: str) -> list[BundleError]:
    """A store model is one the store admitted (its manifest written last), not a file that happens to be there."""
    try:
        Store(root / MODELS_DIR).get(name)
    except StoreError:
        return [BundleError("model.name", f"no model {name!r} in this box's store (/{MODELS_DIR}): add it first "
                                          "(everycycle models add FILE)")]
    return []


def _apply_checked(bundle: Bundle, root: Path, live_network: bool, require_signature_pem: bytes | None,
                   link_wait_s: float, digest: str, previous: dict | None, record_path: Path) -> ApplyResult:
    errors = validate(bundle, require_signature_pem)
    model = bundle.box["model"]
    if not errors and model["source"] == "store":
        errors = _store_model_errors(root, model["name"])
    if errors:
        raise BundleInvalid(errors)
    generated = {name: "ec-" + pysecrets.token_urlsafe(32) for name in bundle.box.get("api", {}).get("generate_keys", [])}
    try:
        existing = json.loads((root / "etc/everycycle/api_keys.json").read_text()).get("keys", [])
    except (OSError, ValueError, AttributeError):
        existing = []
    files = plan_files(bundle, generated, existing)

    # Each new file is staged beside the one it replaces: the same file system (the box's /etc is on the root
    # slot, /var on the data partition), so putting it in place is one rename that cannot fail half way.
    tag = digest[:12]
    staged = {rel: _beside(root / rel, "new", tag) for rel in files}
    # Directories this apply makes, removed again if it fails: nothing half-applied stays behind.
    made = sorted({d for rel in files for d in (root / rel).parents if d.is_relative_to(root) and not d.exists()},
                  key=lambda d: len(d.parts), reverse=True)
    undo = []
    try:
        if live_network:
            undo = apply_network_live(bundle.box["network"]["interfaces"], link_wait_s)
            undo += apply_hostname_live(bundle.box["hostname"])
        for rel, (data, mode) in files.items():
            if isinstance(data, StagedCopy):
                _stage_copy(data, staged[rel], mode)
            else:
                # The services' secrets are theirs from the open file on: a chown by path after the write, in a
                # directory they own (tls/), could be sent through a link they put there.
                atomic_write(staged[rel], data, mode=mode,
                             owner=service_owner(owner_of(rel)) if rel in SERVICE_READ_FILES else None)
        _commit(staged, root, tag, stale_files(root, files))
    except BaseException:
        _undo_live(undo)
        for path in staged.values():
            path.unlink(missing_ok=True)
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()
        raise

    history = (previous or {}).get("history", [])
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    history.append({"digest": digest, "applied_at": now, "hostname": bundle.box["hostname"]})
    record = {"provisioned": True, "digest": digest, "applied_at": now, "hostname": bundle.box["hostname"],
              "files": sorted(files), "history": history[-20:]}
    atomic_write(record_path, (json.dumps(record, indent=2) + "\n").encode(), mode=0o644)
    return ApplyResult(True, digest, record_path, generated, _remove_secrets(bundle))


def _stage_copy(copy: StagedCopy, dest: Path, mode: int) -> None:
    """The bundle's private copy into its staged place: a rename on the same file system (apply stages copies
    beside the model store), else a streamed copy."""
    os.chmod(copy.path, mode)
    try:
        os.replace(copy.path, dest)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        with open(copy.path, "rb") as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(dest, mode)


def _beside(target: Path, kind: str, tag: str) -> Path:
    return target.with_name(f".{target.name}.everycycle-{kind}-{tag}")


def _commit(staged: dict[str, Path], root: Path, tag: str, stale: list[str] = ()) -> None:
    """Move staged files into place and the stale ones out; on any failure put every replaced or removed file
    back."""
    done: list[tuple[Path, Path | None]] = []
    gone: list[tuple[Path, Path]] = []
    try:
        for rel, new in staged.items():
            target = root / rel
            backup = None
            if target.exists():
                backup = _beside(target, "old", tag)
                os.replace(target, backup)
            os.replace(new, target)
            done.append((target, backup))
        for rel in stale:
            target = root / rel
            if target.is_symlink() or target.exists():
                backup = _beside(target, "old", tag)
                os.replace(target, backup)
                gone.append((target, backup))
    except BaseException:
        for target, backup in reversed(gone):
            os.replace(backup, target)
        for target, backup in reversed(done):
            if backup is not None:
                os.replace(backup, target)
            else:
                target.unlink(missing_ok=True)
        raise
    for _, backup in done + gone:
        if backup is not None:
            backup.unlink(missing_ok=True)


def stale_files(root: Path, files: dict) -> list[str]:
    """What an earlier bundle wrote that this one does not, and that must not outlive it: the fleet key (a box
    that leaves its fleet, or becomes a member, which needs only the key's hash), the shard wires' keys and peer
    certificates."""
    candidates = [FLEET_KEY, SHARD_WIRE_KEY, SHARD_HOLDER_KEYS] + [str(p.relative_to(root)) for p in sorted((root / BOX_PEER_CERT_DIR.lstrip("/")).glob("*.pem"))]
    return [rel for rel in candidates if rel not in files and ((root / rel).is_symlink() or (root / rel).exists())]


def _remove_secrets(bundle: Bundle) -> list[str]:
    """Secrets must not stay readable on the boot partition: overwrite, then delete."""
    removed = []
    for f in SECRET_FIELDS:
        rel = field_value(bundle.box, f)
        if not rel:
            continue
        path = bundle.root / rel
        try:
            bundle.path(rel)  # never outside the bundle
            # Never through a symlink: it could name any file on the box (O_NOFOLLOW refuses it; the link
            # itself is removed below, its target left alone).
            fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (OSError, BundleError):
            fd = None
        try:
            if fd is not None:
                st = os.fstat(fd)
                if stat.S_ISREG(st.st_mode):
                    os.write(fd, b"\0" * st.st_size)
                    os.fsync(fd)
            if path.is_symlink() or path.exists():
                path.unlink()
                removed.append(rel)
        except OSError:
            pass  # a read-only boot medium: reported by omission
        finally:
            if fd is not None:
                os.close(fd)
    return removed
