"""Checking a bundle before anything is applied: every problem, each naming its field."""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import re
import struct
from pathlib import Path

from host_runtime.auth.keystore import check_addresses
from host_runtime.common.setting_rules import SettingsError
from host_runtime.engine.model import default_model_path
from host_runtime.fleet.settings import key_text_problem
from provisioning import box_model
from provisioning.bundle import MAX_FILE_BYTES, MAX_MODEL_BYTES, Bundle, BundleError
from provisioning.service_settings import service_settings
from provisioning.signing import verify

SECRET_FIELDS = ("api.tls_key", "bmc.password_file", "fleet.key_file")
FILE_FIELDS = ("ssh.authorized_keys", "api.tls_certificate", "api.tls_key", "model.path", "bmc.password_file",
               "fleet.key_file", "fleet.peer_certificates")  # a list field: each of its entries
FLEET_KEY_NAME = "fleet"  # the fleet key's name in api_keys.json


def field_value(box: dict, dotted: str):
    node = box
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def schema_errors(box: dict) -> list[BundleError]:
    """Where box.toml's shape or a value's own rule is broken (provisioning/box_model.py), each naming its field."""
    return [BundleError(field, words) for field, words in box_model.errors(box)]


def validate(bundle: Bundle, require_signature_pem: bytes | None = None) -> list[BundleError]:
    box = bundle.box
    if require_signature_pem is not None:
        # First: nothing else in an unsigned or altered bundle is read, let alone parsed (a GGUF parser is a
        # large attack surface).

        try:
            verify(bundle, require_signature_pem)
        except BundleError as exc:
            return [exc]
    errors = schema_errors(box)
    if errors:
        return errors  # the checks below assume the shape is right
    declared = box.get("files") or {}
    for field in FILE_FIELDS:
        value = field_value(box, field)
        if value is None or (field == "model.path" and box["model"]["source"] != "bundle"):
            continue
        named = enumerate(value) if isinstance(value, list) else [(None, value)]
        for i, rel in named:
            if rel not in declared:
                where = field if i is None else f"{field}[{i}]"
                errors.append(BundleError(where, f"{rel!r} is not listed with its sha256 in [files]"))
    model_rel = box["model"].get("path") if box["model"]["source"] == "bundle" else None
    readable = set()
    for rel, digest in declared.items():
        try:
            if rel == model_rel:  # streamed to a private copy, hashed on the way: never all in memory
                got = bundle.copy_out(rel, MAX_MODEL_BYTES).sha256
            else:
                got = hashlib.sha256(bundle.read(rel, MAX_FILE_BYTES)).hexdigest()
        except BundleError as exc:
            errors.append(exc)
            continue
        if got != digest:
            errors.append(BundleError(f"files.{rel}", "the file's sha256 does not match the declared one"))
        else:
            readable.add(rel)
    for field in SECRET_FIELDS:
        rel = field_value(box, field)
        if rel in readable:
            mode = bundle.mode(rel)  # as it was when read: no second look at the path
            if mode & 0o077:
                errors.append(BundleError(field, f"{rel} has mode {mode:04o}: secrets must not be readable by "
                                                 "others (chmod 600)"))
    errors += _network_errors(box["network"]["interfaces"])
    errors += _fleet_errors(bundle, box, readable)
    errors += _policy_errors(box)
    keys_rel = field_value(box, "ssh.authorized_keys")
    if keys_rel in readable:
        problem = authorized_keys_problem(bundle.read(keys_rel).decode("utf-8", "replace"))
        if problem:
            errors.append(BundleError("ssh.authorized_keys", problem))
    model = box["model"]
    model_quant = None  # the bundle's model's quantization, from its one parse
    if model["source"] == "bundle":
        if not model.get("path"):
            errors.append(BundleError("model.path", "is required when model.source is 'bundle'"))
        elif model["path"] in readable:
            file_type, error = _parse_gguf(bundle.copy_out(model["path"], MAX_MODEL_BYTES).path)
            if error:
                errors.append(BundleError("model.path", f"{model['path']} is not a readable GGUF model: {error}"))
            else:
                model_quant = model_quantization(file_type, model["path"]) or ""
    elif model["source"] == "pull" and not model.get("url"):
        errors.append(BundleError("model.url", "is required when model.source is 'pull'"))
    elif model["source"] == "store" and not model.get("name"):
        errors.append(BundleError("model.name", "is required when model.source is 'store'"))
    for key in ("url", "sha256", "name"):
        if model["source"] != "pull" and model.get(key) and not (key == "name" and model["source"] == "store"):
            errors.append(BundleError(f"model.{key}", "is only used when model.source is 'pull'"
                                                      + (" or 'store'" if key == "name" else "")))
    bmc = box["bmc"]
    if bmc["mode"] == "ipmi":
        for key in ("address", "user", "password_file"):
            if not bmc.get(key):
                errors.append(BundleError(f"bmc.{key}", "is required when bmc.mode is 'ipmi'"))
    try:
        service_settings(box)  # every service's settings, each checked by its own type
    except SettingsError as exc:
        errors.append(BundleError(exc.field, exc.message))
    errors += _quantization_errors(box, model_quant)
    power = box["power"]
    if "target_c" in power and "ceiling_c" in power and power["ceiling_c"] <= power["target_c"]:
        errors.append(BundleError("power.ceiling_c", "must be above power.target_c"))
    return errors


def model_quantization(file_type: int | None, name: str) -> str | None:
    """A GGUF's quantization as owners write it ('Q4_1'): from general.file_type, else from the file name."""
    import gguf

    if file_type is not None:
        try:
            return gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    found = re.search(r"\.(I?Q\d[\w]*|F16|BF16|F32)\.gguf$", name, re.IGNORECASE)
    return found.group(1).upper() if found else None


def _quantization_errors(box: dict, bundle_model_quant: str | None) -> list[BundleError]:
    """model.quantization must be what the model is: it was accepted and ignored. bundle_model_quant: the bundle's
    model's ('' when unknown), None when it could not be read (its own error says why)."""
    wanted = box["model"].get("quantization")
    if not wanted:
        return []
    if box["model"]["source"] == "image":
        have = model_quantization(None, default_model_path().name)
        where = "the image's model"
    elif bundle_model_quant is not None:
        have = bundle_model_quant or None
        where = box["model"]["path"]
    else:
        return []
    if have is None or have.upper() != str(wanted).upper():
        return [BundleError("model.quantization", f"{where} is {have or 'of an unknown quantization'}, not {wanted}")]
    return []


SSH_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521",
                 "sk-ssh-ed25519@openssh.com", "sk-ecdsa-sha2-nistp256@openssh.com")


def authorized_keys_problem(text: str) -> str | None:
    """What is wrong with an authorized_keys file's text, or None: each line that is not blank or a comment must be
    an OpenSSH public key (its type, then base64 whose first field names the same type), as ssh-keygen writes
    them; a private key pasted by mistake is refused."""
    if "PRIVATE KEY" in text:
        return "holds a private key: give the public one (the .pub file)"
    count = 0
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        at = next((i for i, f in enumerate(fields) if f in SSH_KEY_TYPES), None)  # options may come first
        if at is None or at + 1 >= len(fields):
            return f"line {number} is not an SSH public key (it starts with one of {', '.join(SSH_KEY_TYPES[:3])}...)"
        try:
            blob = base64.b64decode(fields[at + 1], validate=True)
            (length,) = struct.unpack(">I", blob[:4])
            named = blob[4:4 + length].decode()
        except (binascii.Error, struct.error, UnicodeDecodeError, ValueError):
            named = None
        if named != fields[at]:
            return f"line {number}: the {fields[at]} key's data is damaged (copy the whole line from the .pub file)"
        count += 1
    return None if count else "holds no SSH public key"


def _parse_gguf(path: Path):
    """Parse the private copy that was hashed (Bundle.copy_out). (general.file_type or None, None) when it parses,
    (None, why) when it does not."""
    import gguf

    try:
        field = gguf.GGUFReader(path).fields.get("general.file_type")
    except Exception as exc:  # gguf raises ValueError, struct errors, and more on foreign files
        return None, str(exc) or type(exc).__name__
    try:
        return (int(field.parts[field.data[0]][0]) if field is not None else None), None
    except (IndexError, TypeError, ValueError):
        return None, None


def _policy_errors(box: dict) -> list[BundleError]:
    """Each [api.policies] entry names a key the bundle gives the box, and its addresses are addresses."""
    api = box.get("api", {})
    named = {k["name"] for k in api.get("keys", [])} | set(api.get("generate_keys", []))
    if box.get("fleet", {}).get("role", "none") != "none":
        named.add(FLEET_KEY_NAME)
    errors = []
    for name, policy in api.get("policies", {}).items():
        if name not in named:
            errors.append(BundleError(f"api.policies.{name}", f"names no key: {name!r} is not in api.keys or "
                                                             "api.generate_keys"))
        try:
            check_addresses(policy.get("allowed_from", ()))
        except ValueError as exc:
            errors.append(BundleError(f"api.policies.{name}.allowed_from", str(exc)))
    return errors


def _fleet_errors(bundle: Bundle, box: dict, readable: set) -> list[BundleError]:
    """The fleet key is one line (from `everycycle keys create`); each peer certificate is a PEM certificate."""
    fleet = box.get("fleet", {})
    errors = []
    rel = fleet.get("key_file")
    if rel in readable:
        problem = key_text_problem(bundle.read(rel).decode("utf-8", "replace").strip())
        if problem:
            errors.append(BundleError("fleet.key_file", f"{rel} {problem}"))
    for i, cert in enumerate(fleet.get("peer_certificates", [])):
        if cert in readable:  # one that is not declared has its error from FILE_FIELDS
            from cryptography import x509

            try:
                x509.load_pem_x509_certificate(bundle.read(cert))
            except ValueError:
                errors.append(BundleError(f"fleet.peer_certificates[{i}]", f"{cert} is not a PEM certificate"))
    api = box.get("api", {})
    if fleet.get("role", "none") != "none" and FLEET_KEY_NAME in [k["name"] for k in api.get("keys", [])] + \
            list(api.get("generate_keys", [])):
        errors.append(BundleError("api.keys", f"the key name {FLEET_KEY_NAME!r} is the fleet key's"))
    return errors


def _network_errors(interfaces: list[dict]) -> list[BundleError]:
    errors, names, networks = [], set(), []
    for i, iface in enumerate(interfaces):
        where = f"network.interfaces[{i}]"
        if iface["name"] in names:
            errors.append(BundleError(f"{where}.name", f"interface {iface['name']!r} is configured twice"))
        names.add(iface["name"])
        # Checked in both modes: each becomes a DNS= line of the networkd file, and a newline in one would add
        # sections of its own ("1.1.1.1\n[Route]...").
        for j, dns in enumerate(iface.get("dns", [])):
            try:
                ipaddress.ip_address(dns)
            except ValueError:
                errors.append(BundleError(f"{where}.dns[{j}]", f"{dns!r} is not an IP address"))
        if iface["mode"] == "dhcp":
            for key in ("address", "gateway"):
                if key in iface:
                    errors.append(BundleError(f"{where}.{key}", "is not used with mode 'dhcp'"))
            continue
        try:
            net = ipaddress.ip_interface(iface.get("address", ""))
        except ValueError:
            errors.append(BundleError(f"{where}.address", f"{iface.get('address')!r} is not an address with a "
                                                          "prefix length, like 192.168.1.20/24"))
            continue
        if net.network.prefixlen == net.max_prefixlen:
            errors.append(BundleError(f"{where}.address", "needs a prefix length shorter than a single host"))
        for other_where, other in networks:
            if other.ip == net.ip:
                errors.append(BundleError(f"{where}.address", f"{net.ip} is also the address of {other_where}"))
            elif other.network.overlaps(net.network):
                errors.append(BundleError(f"{where}.address", f"{net.network} overlaps {other_where}'s {other.network}"))
        networks.append((where, net))
        if "gateway" in iface:
            try:
                gw = ipaddress.ip_address(iface["gateway"])
            except ValueError:
                errors.append(BundleError(f"{where}.gateway", f"{iface['gateway']!r} is not an IP address"))
            else:
                if gw not in net.network:
                    errors.append(BundleError(f"{where}.gateway", f"{gw} is outside {net.network}"))
    return errors
