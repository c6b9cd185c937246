"""The first-boot wizard: the same fields as box.toml, checked as typed, written as a bundle, applied through
exactly the code path a bundle from the boot disk takes (provisioning.apply)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import tomli_w
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Input, Label, Select, Static

from host_runtime.auth import admin_passphrase
from host_runtime.auth.carried_keys import BOX_KEYS, refresh_carried
from host_runtime.auth.keystore import KeyStoreError, load_keys, revoke_key
from host_runtime.common.atomic_file import atomic_write
from host_runtime.console.from_worker import draw_from_worker
from host_runtime.engine.model import default_model_path
from host_runtime.models import catalog, pull
from host_runtime.models.manifest import name_for_file
from host_runtime.models.store import Store, StoreError
from host_runtime.models.verdict import VerdictError, verdict_for
from host_runtime.update.system import UpdatePaths
from provisioning.apply import BundleInvalid, apply
from provisioning.bundle import Bundle, open_bundle
from provisioning.service_settings import MODELS_DIR
from provisioning.validate import validate

# The key an image built with `make image BUNDLE_PUBKEY=` trusts (image/build.sh puts it there): on such an image
# only bundles it signed are applied, and the wizard's own (unsigned) bundle never is.
TRUSTED_BUNDLE_KEY = "etc/everycycle/bundle-signing.pub"


def context_for_memory(total_bytes: int) -> int:
    """A context that leaves the box room to batch: 4k under 8 GiB of RAM, 8k above."""
    return 8192 if total_bytes >= 8 * 2**30 else 4096


def box_from_answers(a: dict) -> tuple[dict, dict[str, bytes]]:
    """Pure: the wizard's answers as a box.toml dict, and the files the bundle must carry."""
    interfaces = []
    for link in a["links"]:
        iface = {"name": link["name"], "mode": link["mode"]}
        if link["mode"] == "static":
            iface["address"] = link.get("address", "")
            if link.get("gateway"):
                iface["gateway"] = link["gateway"]
            if link.get("dns"):
                iface["dns"] = [d.strip() for d in link["dns"].split(",") if d.strip()]
        interfaces.append(iface)
    box = {"schema_version": 1, "hostname": a["hostname"], "network": {"interfaces": interfaces},
           "api": {"port": int(a.get("port") or 8443), "generate_keys": ["owner"]},
           "model": model_from_answers(a),
           "bmc": {"mode": a["bmc_mode"]},
           "power": {"target_c": float(a["target_c"]), "ceiling_c": float(a["ceiling_c"])}}
    files: dict[str, bytes] = {}
    if a["bmc_mode"] == "ipmi":
        box["bmc"].update(address=a.get("bmc_address", ""), user=a.get("bmc_user", ""),
                          password_file="files/bmc.pass")
        files["files/bmc.pass"] = a.get("bmc_password", "").encode() + b"\n"
    if a.get("ssh_key", "").strip():
        box["ssh"] = {"authorized_keys": "files/authorized_keys"}
        files["files/authorized_keys"] = a["ssh_key"].strip().encode() + b"\n"
    if files:
        box["files"] = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    return box, files


MODEL_SOURCES = [("the image's SmolLM2-135M (built in)", "image"),
                 ("a model from the catalog that fits this box, pulled at first boot", "catalog"),
                 ("a GGUF file: a USB stick or the boot disk", "file"),
                 ("a URL on the LAN, or hf://OWNER/REPO:QUANT", "pull")]


def catalog_choices(room_bytes: int) -> list[tuple[str, str]]:
    """The catalog's chat models that fit `room_bytes` by size, the largest first, as the wizard's choices."""
    return [(f"{e.full_name}  {e.size_gb:.1f} GB  {', '.join(e.can)}: {e.why}", e.full_name)
            for e in catalog.for_the_wizard(room_bytes)]


def model_from_answers(a: dict) -> dict:
    """box.toml's [model]: the image's model, a URL pulled at first boot (its sha256 checked), or a file the wizard
    copies into the store when it applies (source 'store', by the name the store gives it)."""
    source, location = a.get("model_source") or "image", (a.get("model_location") or "").strip()
    model: dict = {"source": {"file": "store", "catalog": "pull"}.get(source, source)}
    if source == "catalog":  # the pull's sha256 is the Hub listing's own: none is asked for
        chosen = (a.get("model_catalog") or "").strip()
        if chosen:
            model.update(url=chosen)
    elif source == "pull":
        model.update(url=location, sha256=(a.get("model_sha256") or "").strip())
    elif source == "file":
        model["name"] = name_for_file(Path(location).name) if location else ""
    model["context_length"] = int(a["context_length"])
    return model


def write_bundle(directory: Path, box: dict, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        atomic_write(directory / rel, data, mode=0o600)  # the only files the wizard writes are secrets
    atomic_write(directory / "box.toml", tomli_w.dumps(box).encode(), mode=0o600)
    return directory


def configurable_links(network) -> list[dict]:
    """The links the wizard offers: the physical NICs discovery found (kind "physical": no virtual link kind such as
    ifb, dummy, veth, bridge or loopback), which are what a first boot configures."""
    if not isinstance(network, list):
        return []
    return [link for link in network if isinstance(link, dict) and link.get("kind") == "physical"]


SIGNED_ONLY = ("refused: this image applies only provisioning bundles signed by its key, and the wizard's are not: "
               "put a signed bundle (everycycle provision sign) in the everycycle folder of the boot disk's EFI "
               "partition and restart the box")


def _keys_on(root: Path) -> list:
    """The API keys a provisioned box holds (names and hints only), for the owner to revoke on re-provisioning."""
    try:
        return load_keys(root / BOX_KEYS)
    except KeyStoreError:
        return []


class Wizard(Screen):
    """One form; every change re-checks the whole box and shows the problems next to the preview."""

    BINDINGS = [("escape", "app.pop_screen", "back to the dashboard")]

    def __init__(self, links: list[dict], total_memory: int, bundle_dir: Path, root: Path,
                 topology: Path | None = None):
        super().__init__()
        self.topology = topology  # discovery's: the devices and free memory the model's verdict is judged on
        self._verdict: tuple[tuple, object] | None = None  # (what was judged, its Verdict or why not)
        self.links = links or [{"name": "eth0"}]
        self.total_memory = total_memory
        self.bundle_dir = bundle_dir
        self.root = root
        self.generated: dict[str, str] = {}
        self.has_passphrase = admin_passphrase.stored(root) is not None
        self.existing_keys = _keys_on(Path(root))
        try:
            self.trusted_key: bytes | None = (Path(root) / TRUSTED_BUNDLE_KEY).read_bytes()
        except OSError:
            self.trusted_key = None

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("EveryCycle first boot: set up this box (Tab moves, Apply writes and applies)")
            yield Label("Hostname")
            yield Input("everycycle", id="hostname")
            for i, link in enumerate(self.links):
                addrs = ", ".join(a["address"] for a in link.get("addresses", [])) or "no address"
                yield Label(f"Network: {link['name']} ({link.get('state', '?')}, now {addrs})")
                yield Select([("DHCP", "dhcp"), ("static", "static")], value="dhcp", id=f"mode-{i}", allow_blank=False)
                yield Input(placeholder="address/prefix, e.g. 192.168.1.20/24", id=f"address-{i}")
                yield Input(placeholder="gateway", id=f"gateway-{i}")
                yield Input(placeholder="DNS servers, comma-separated", id=f"dns-{i}")
            yield Label("Model: the built-in one, a GGUF file, or a URL (the size and whether it fits are shown "
                        "before Apply)")
            yield Select(MODEL_SOURCES, value="image", id="model_source", allow_blank=False)
            choices = catalog_choices(self._room())
            yield Select(choices, prompt="no catalog model fits this box" if not choices else "choose a model",
                         value=choices[0][1] if choices else Select.BLANK, id="model_catalog")
            yield Input(placeholder="/media/usb/model.gguf, http://nas.lan/model.gguf or hf://owner/repo/file.gguf",
                        id="model_location")
            yield Input(placeholder="its sha256, 64 hex digits (a URL's is required: the pull is refused unless it "
                                    "matches; a file's is checked if given)", id="model_sha256")
            yield Static("", id="model_verdict")
            yield Label(f"Context per sequence, at most (for {self.total_memory / 2**30:.0f} GiB of RAM; the "
                        "planner lowers it where memory is short, and says so)")
            yield Input(str(context_for_memory(self.total_memory)), id="context_length")
            yield Label("API port, HTTPS (an API key named 'owner' is generated and shown once)")
            yield Input("8443", id="port")
            yield Label("BMC")
            yield Select([("none", "none"), ("IPMI over LAN", "ipmi")], value="none", id="bmc_mode", allow_blank=False)
            yield Input(placeholder="BMC address", id="bmc_address")
            yield Input(placeholder="BMC user", id="bmc_user")
            yield Input(placeholder="BMC password", password=True, id="bmc_password")
            yield Label("Power policy: target and ceiling temperature (C)")
            yield Input("75", id="target_c")
            yield Input("87", id="ceiling_c")
            yield Label("SSH public key for the admin (root), optional: one line from your id_ed25519.pub")
            yield Input(placeholder="ssh-ed25519 AAAA... you@laptop", id="ssh_key")
            yield Label("Admin passphrase: what reopens this wizard later (at least 8 characters, twice)"
                        + ("; leave empty to keep the current one" if self.has_passphrase else ""))
            yield Input(placeholder="admin passphrase", password=True, id="admin_passphrase")
            yield Input(placeholder="admin passphrase again", password=True, id="admin_passphrase_again")
            if self.existing_keys:
                from textual.widgets import SelectionList

                yield Label("API keys already on this box: tick those to revoke (Space); 'owner' is replaced by "
                            "the new one")
                yield SelectionList(*[(f"{k.name}  {k.hint}", k.name) for k in self.existing_keys], id="revoke")
            yield Static("", id="problems")
            yield Static("", id="preview")
            yield Button("Apply", id="apply", variant="primary")
            yield Static("", id="result")

    def on_mount(self) -> None:
        self._show_model_fields()
        self.recheck()
        if self.trusted_key is not None:
            self.query_one("#apply", Button).disabled = True
            self.query_one("#result", Static).update(SIGNED_ONLY)

    def answers(self) -> dict:
        def val(wid: str) -> str:
            return str(self.query_one(f"#{wid}").value or "")

        links = [{"name": link["name"], "mode": val(f"mode-{i}"), "address": val(f"address-{i}"),
                  "gateway": val(f"gateway-{i}"), "dns": val(f"dns-{i}")} for i, link in enumerate(self.links)]
        return {"hostname": val("hostname"), "links": links, "port": val("port"), "context_length": val("context_length"),
                "bmc_mode": val("bmc_mode"), "bmc_address": val("bmc_address"), "bmc_user": val("bmc_user"),
                "bmc_password": val("bmc_password"), "target_c": val("target_c"), "ceiling_c": val("ceiling_c"),
                "ssh_key": val("ssh_key"), "model_source": val("model_source"),
                "model_location": val("model_location"), "model_sha256": val("model_sha256"),
                "model_catalog": self._catalog_choice()}

    def candidate(self) -> tuple[dict | None, dict, list[str]]:
        try:
            box, files = box_from_answers(self.answers())
        except ValueError as exc:
            return None, {}, [f"a number is expected: {exc}"]
        # Files live only in memory until Apply: the bundle is checked with them as they will be written (0600).
        errors = validate(Bundle(Path("/nonexistent"), box, tomli_w.dumps(box).encode(),
                                 _files={rel: (data, 0o600) for rel, data in files.items()}))
        problems = [f"{e.field}: {e.message}" for e in errors]
        problems += self._model_problems()
        passphrase, again = self._passphrases()
        if passphrase or again or not self.has_passphrase:
            wrong = admin_passphrase.problem(passphrase, again)
            if wrong:
                problems.append(f"admin passphrase: {wrong}")
        return box, files, problems

    # ---- the model: its verdict, judged off the UI thread --------------------------------------------------

    def _model_key(self) -> tuple:
        a = self.answers()
        location = a["model_catalog"] if a["model_source"] == "catalog" else a["model_location"].strip()
        return a["model_source"], location, a["context_length"]

    def _catalog_choice(self) -> str:
        value = self.query_one("#model_catalog", Select).value
        return value if isinstance(value, str) else ""  # Select.BLANK: none chosen (none fits)

    def _room(self) -> int:
        """What a model may take here: the RAM, and the GPUs' free memory discovery saw."""
        gpus = 0
        if self.topology is not None:
            try:
                from host_runtime.placement.session import devices_from_topology

                gpus = sum(d.free_bytes for d in devices_from_topology(json.loads(self.topology.read_text()))[0])
            except (OSError, ValueError, KeyError, TypeError):
                gpus = 0
        return self.total_memory + gpus

    def _model_problems(self) -> list[str]:
        source, location, _ = key = self._model_key()
        if source == "image":
            return []
        if not location:
            return [{"file": "model: give the file's path", "catalog": "model: no catalog model fits this box: choose "
                                                                   "another source"}.get(source, "model: give the URL")]
        if self._verdict is None or self._verdict[0] != key:
            return ["model: reading its header to see whether it fits"]
        verdict = self._verdict[1]
        if isinstance(verdict, str):
            return [f"model: {verdict}"]
        return [] if verdict.fits else ["model: it does not fit this box (see above)"]

    def _judge_soon(self) -> None:
        """After typing pauses: a URL is asked once, not per keystroke."""
        key = self._model_key()
        if self._verdict is None or self._verdict[0] != key:
            self.set_timer(0.6, lambda: self._judge(key))

    def _judge(self, key: tuple) -> None:
        # A timer or a worker may end after the wizard was closed (applied, or the console quitting): nothing to show.
        line = self._verdict_line()
        if line is None or key != self._model_key() or (self._verdict and self._verdict[0] == key):
            return
        line.update("reading the model's header…")
        self.run_worker(lambda: self._judged(key), thread=True, exclusive=True, group="verdict")

    def _judged(self, key: tuple) -> None:
        """In a worker thread: the verdict (a header over the network can take seconds)."""
        source, location, context = key
        try:
            cap = int(context) if context.strip() else 0
            verdict = verdict_for(str(default_model_path()) if source == "image" else location, self.topology,
                                  cap or context_for_memory(self.total_memory))
        except ValueError:
            verdict = "the context is not a number"
        except (VerdictError, OSError) as exc:
            verdict = f"cannot read it: {exc}"
        draw_from_worker(self, self._show_verdict, key, verdict)

    def _show_verdict(self, key: tuple, verdict) -> None:
        self._verdict = (key, verdict)
        line = self._verdict_line()
        if line is not None and key == self._model_key():
            line.update(verdict if isinstance(verdict, str) else verdict.text)
            self.recheck()

    def _verdict_line(self) -> Static | None:
        """The verdict's line while it is on the screen: the typing pause's timer and the header's worker can both
        outlive it (the wizard applied, or the console quitting: a timer fired with the line already gone, under
        the full suite's load, and NoMatches failed the app)."""
        if not self.is_attached:
            return None
        found = self.query("#model_verdict")
        return found.first(Static) if found else None

    def _passphrases(self) -> tuple[str, str]:
        return (str(self.query_one("#admin_passphrase").value or ""),
                str(self.query_one("#admin_passphrase_again").value or ""))

    def recheck(self) -> bool:
        box, _, problems = self.candidate()
        self.query_one("#problems", Static).update("\n".join(problems) if problems else "no problems")
        shown = dict(box or {})
        self.query_one("#preview", Static).update(tomli_w.dumps(shown) if box else "")
        return not problems

    def on_input_changed(self, event) -> None:
        self.recheck()
        self._judge_soon()

    def on_select_changed(self, event) -> None:
        self._show_model_fields()
        self.recheck()
        self._judge_soon()

    def _show_model_fields(self) -> None:
        """The file's path or URL and its sha256 only where the model is not the image's own."""
        source = self.query_one("#model_source", Select).value
        for wid in ("model_location", "model_sha256"):
            self.query_one(f"#{wid}", Input).display = source in ("file", "pull")
        self.query_one("#model_catalog", Select).display = source == "catalog"

    def _revoke_ticked(self) -> list[str]:
        """Re-provisioning keeps the keys already on the box (plan_files): the owner revokes the ones ticked."""
        if not self.existing_keys:
            return []
        from textual.widgets import SelectionList

        ticked = list(self.query_one("#revoke", SelectionList).selected)
        return [name for name in ticked if revoke_key(self.root / BOX_KEYS, name)]

    def _recarry(self) -> None:
        """An update waiting for its reboot carries the configuration it copied: copy this one instead."""
        try:
            refresh_carried(self.root / BOX_KEYS, UpdatePaths(root=self.root,
                                                              state=self.root / "var/lib/everycycle/update"))
        except OSError:
            pass  # not root (a developer's console): nothing it could carry either

    def on_button_pressed(self, event) -> None:
        if event.button.id != "apply" or not self.recheck():
            return
        if self.trusted_key is not None:
            self.query_one("#result", Static).update(SIGNED_ONLY)
            return
        box, files, _ = self.candidate()
        answers = self.answers()
        if answers["model_source"] == "file":  # the widgets read here, on the UI thread, not in the worker
            location, sha256 = Path(answers["model_location"].strip()), answers["model_sha256"].strip() or None
            self.query_one("#apply", Button).disabled = True
            self.run_worker(lambda: self._copy_then_apply(box, files, location, sha256), thread=True,
                            exclusive=True, group="apply")
            return
        self._apply(box, files)

    def _copy_then_apply(self, box: dict, files: dict[str, bytes], location: Path, sha256: str | None) -> None:
        """In a worker thread: the GGUF file copied into the store (hashed, read as a GGUF, then copied: a minute
        for a large one, said as it goes), then the bundle applied on the UI thread."""
        def say(line: str, enable_apply: bool = False) -> None:  # widgets touched on the UI thread only
            draw_from_worker(self, self._show_result, line, enable_apply)

        store, name = Store(self.root / MODELS_DIR), box["model"]["name"]
        try:
            try:
                store.get(name)
                say(f"{name} is already in the model store: using it")
            except StoreError:
                say(f"copying {location} ({location.stat().st_size / 2**30:.1f} GiB) into the model store as {name}…")
                pull.add(store, location, name, sha256=sha256, say=say)
        except (StoreError, OSError) as exc:
            say(f"refused: the model could not be added: {exc}", enable_apply=True)
            return
        self.app.call_from_thread(self._apply, box, files)

    def _show_result(self, line: str, enable_apply: bool) -> None:
        self.query_one("#result", Static).update(line)
        if enable_apply:
            self.query_one("#apply", Button).disabled = False

    def _apply(self, box: dict, files: dict[str, bytes]) -> None:
        self.query_one("#apply", Button).disabled = False
        bundle = open_bundle(write_bundle(self.bundle_dir, box, files))
        try:
            result = apply(bundle, self.root)
        except BundleInvalid as exc:
            self.query_one("#result", Static).update("refused: " + "; ".join(str(e) for e in exc.errors))
            return
        passphrase, _ = self._passphrases()
        if passphrase:
            admin_passphrase.save(self.root, passphrase)
            self.has_passphrase = True
        revoked = self._revoke_ticked()
        self._recarry()
        self.generated = result.generated_keys
        keys = "".join(f"\nAPI key {n}: {k}  (write it down: it is shown only now)" for n, k in self.generated.items())
        gone = f"\nrevoked: {', '.join(revoked)}" if revoked else ""
        self.query_one("#result", Static).update(f"applied bundle {result.digest[:12]}{gone}{keys}")
        if hasattr(self.app, "on_provisioned"):
            self.app.on_provisioned(result)
