"""Boots a built image and checks it from outside, as a LAN client and the box's admin would see it.

  boot_check.py nspawn DIR       the directory image in systemd-nspawn (CI, every run)
  boot_check.py qemu DISK.raw    the disk image under qemu with UEFI, software emulation (slow)

Either way the owner's path is taken: a provisioning bundle (a static address or DHCP, one API key,
one SSH key) goes where the owner would drop it, and the box's first boot applies it. Then, from
outside: /health, /ready and a chat completion from the default model (the openai client); over
SSH: `supervisorctl status` (every program RUNNING), `systemctl --failed` (nothing), the first
boot's record. Prints progress on stderr and one JSON summary on stdout; exits 1 if a check failed.
Needs root (network namespace, nspawn) and the project's venv (openai). Run by `make image-test`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # image.* beside host_runtime.*, run as a script

from host_runtime.common import http_client  # noqa: E402
from host_runtime.common.processes import stop_process  # noqa: E402
from host_runtime.update.gate import EXPECTED_PROGRAMS  # noqa: E402
HTTPS_PORT, HTTP_PORT = 8443, 8080  # the front's defaults, which the test bundle keeps
SHARD_PORT = 50052  # where a box with a static address lends its devices (box.toml [fleet] shard_listen)
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
OVMF_CODE = Path("/usr/share/OVMF/OVMF_CODE_4M.fd")
OVMF_VARS = Path("/usr/share/OVMF/OVMF_VARS_4M.fd")


class CheckFailed(Exception):
    pass


def say(msg: str) -> None:
    print(f"[boot-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- pure parts: what the bundle says, what the box's answers mean ----

def bundle_toml(hostname: str, iface: dict, api_key_sha256: str, shard_listen: str = "") -> str:
    """The test bundle; with `shard_listen`, the box is a fleet member lending its devices there (its fleet key
    is files/fleet.key)."""
    net = ", ".join(f'{k} = "{v}"' for k, v in iface.items())
    fleet = (f'\n[fleet]\nrole = "member"\nkey_file = "files/fleet.key"\nshard_listen = "{shard_listen}"\n'
             if shard_listen else "")
    return f"""# Written by image/boot_check.py
schema_version = 1
hostname = "{hostname}"

[network]
interfaces = [{{ {net} }}]

[api]
port = {HTTPS_PORT}
keys = [{{ name = "boot-check", sha256 = "{api_key_sha256}" }}]

[ssh]
authorized_keys = "files/authorized_keys"

[model]
source = "image"

[bmc]
mode = "none"

[power]
target_c = 75
ceiling_c = 87
""" + fleet


def parse_supervisor_status(text: str) -> dict[str, str]:
    """`supervisorctl status` lines ("serving   RUNNING   pid 12, uptime 0:00:09") as {program: state}."""
    states = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 2:
            states[words[0]] = words[1]
    return states


# ---- the box: one started with nspawn or qemu, reached over HTTP and SSH ----

class Box:
    http_base: str   # plain HTTP: only /health and the certificates answer, everything else redirects
    https_base: str  # the API, behind the front's TLS
    ssh_host: str
    ssh_port: int
    log_path: Path
    proc: subprocess.Popen

    def __init__(self, work: Path):
        self.work = work
        self.key = work / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "boot-check", "-f", str(self.key)],
                       check=True)
        self.api_key = "ec-" + secrets.token_urlsafe(24)
        self.hostname = "boot-check"
        self.fleet_key = work / "fleet.key"
        self.fleet_key.write_text(secrets.token_urlsafe(32) + "\n")
        self.fleet_key.chmod(0o600)

    def write_bundle(self, dest: Path, iface: dict) -> None:
        from host_runtime.auth.keystore import hash_key
        from provisioning.bundle import open_bundle
        from provisioning.validate import validate

        (dest / "files").mkdir(parents=True)
        pub = Path(str(self.key) + ".pub").read_bytes()
        (dest / "files/authorized_keys").write_bytes(pub)
        shard_listen = f"{iface['address'].split('/')[0]}:{SHARD_PORT}" if iface["mode"] == "static" else ""
        toml = bundle_toml(self.hostname, iface, hash_key(self.api_key), shard_listen)
        toml += f'\n[files]\n"files/authorized_keys" = "{hashlib.sha256(pub).hexdigest()}"\n'
        if shard_listen:  # the fleet key stays here for the check's holder end; the bundle's copy is wiped
            (dest / "files/fleet.key").write_text(self.fleet_key.read_text())
            (dest / "files/fleet.key").chmod(0o600)
            toml += f'"files/fleet.key" = "{hashlib.sha256(self.fleet_key.read_bytes()).hexdigest()}"\n'
        (dest / "box.toml").write_text(toml)
        errors = validate(open_bundle(dest))
        if errors:
            raise CheckFailed(f"the test bundle does not validate: {'; '.join(map(str, errors))}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ssh(self, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-i", str(self.key), "-p", str(self.ssh_port), "-o", "StrictHostKeyChecking=no",
             "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
             "-o", "LogLevel=ERROR", f"root@{self.ssh_host}", command],
            capture_output=True, text=True, timeout=timeout)

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class NspawnBox(Box):
    has_tty1 = False

    def start(self, image_dir: Path) -> None:
        tag = os.getpid() % 100000
        self.netns, self.host_if = f"ecboot-{tag}", f"ecb{tag}h"
        subnet = 20 + tag % 200
        host_ip, box_ip = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
        self.box_ip, self.moved = box_ip, (f"10.232.{subnet}.1", f"10.232.{subnet}.2")  # host, box: a new lease
        bundle = self.work / "bundle"
        self.write_bundle(bundle, {"name": "eth0", "mode": "static", "address": f"{box_ip}/30"})
        run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True)  # noqa: E731
        run("ip", "netns", "add", self.netns)
        # The box's end is eth0 and starts unconfigured: the bundle's first boot must bring it up.
        run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.netns)
        run("ip", "addr", "add", f"{host_ip}/30", "dev", self.host_if)
        run("ip", "link", "set", self.host_if, "up")
        self.http_base, self.ssh_host, self.ssh_port = f"http://{box_ip}:{HTTP_PORT}", box_ip, 22
        self.https_base = f"https://{box_ip}:{HTTPS_PORT}"
        self.log_path = self.work / "console.log"
        argv = ["systemd-nspawn", "--quiet", "--boot", "--ephemeral", "--directory", str(image_dir),
                "--machine", f"ecboot{tag}", f"--network-namespace-path=/run/netns/{self.netns}",
                # A box owns its network: first boot and networkd configure eth0 (CAP_NET_ADMIN).
                "--capability=CAP_NET_ADMIN", "--keep-unit", "--register=no",
                f"--bind={bundle}:/efi/everycycle", "--console=pipe"]
        say("starting: " + " ".join(argv))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> float | None:
        """Orderly shutdown (nspawn turns SIGTERM into the container's poweroff); seconds it took."""
        took = stop_process(self.proc, 90) if getattr(self, "proc", None) else None
        if getattr(self, "netns", None):
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
            subprocess.run(["ip", "netns", "del", self.netns], capture_output=True)
        return took


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class QemuBox(Box):
    has_tty1 = True
    IFACE = "enp0s3"  # virtio-net at PCI slot 3 of q35's root bus: a fixed predictable name
    EXTRA_DISK = 4 << 30  # the box's disk is larger than the image: the data partition must grow into the rest
    cpu_quota: float | None = None  # percent of one host CPU for qemu: a slower box, on demand
    _quota = None

    def start(self, disk: Path) -> None:
        # A sparse copy: the bundle is written into its ESP and the box writes to its disk.
        self.disk = self.work / "disk.raw"
        subprocess.run(["cp", "--sparse=always", str(disk), str(self.disk)], check=True)
        table = json.loads(subprocess.run(["sfdisk", "--json", str(self.disk)], check=True,
                                          capture_output=True, text=True).stdout)["partitiontable"]
        sector = table.get("sectorsize", 512)
        data = next((p for p in table["partitions"] if p.get("name") == "everycycle-data"), None)
        if data is None:
            raise CheckFailed(f"{disk} has no data partition (everycycle-data)")
        self.data_min_bytes = data["size"] * sector + self.EXTRA_DISK * 3 // 4
        esp = next((p for p in table["partitions"] if p["type"].upper() == ESP_TYPE), None)
        if esp is None:
            raise CheckFailed(f"{disk} has no EFI system partition")
        os.truncate(self.disk, self.disk.stat().st_size + self.EXTRA_DISK)
        bundle = self.work / "bundle"
        self.write_bundle(bundle, {"name": self.IFACE, "mode": "dhcp"})
        self._copy_to_esp(bundle, esp["start"] * sector)
        self.vars_copy = self.work / "OVMF_VARS.fd"
        shutil.copy(OVMF_VARS, self.vars_copy)
        self.ports = _free_port(), _free_port(), _free_port()
        http, https, ssh = self.ports
        self.http_base, self.ssh_host, self.ssh_port = f"http://127.0.0.1:{http}", "127.0.0.1", ssh
        self.https_base = f"https://127.0.0.1:{https}"
        self.log_path = self.work / "serial.log"
        self.boot()

    def boot(self) -> None:
        """Start qemu on the box's disk as it is now (again after a power cut: the same disk and UEFI variables)."""
        http, https, ssh = self.ports
        # KVM is present on these hosts but QEMU crashes on it: software emulation, with a CPU model
        # that has the AVX2/FMA/F16C the portable llama.cpp build needs.
        argv = ["qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "max", "-smp", "2", "-m", "3072",
                "-drive", f"if=pflash,format=raw,readonly=on,file={OVMF_CODE}",
                "-drive", f"if=pflash,format=raw,file={self.vars_copy}",
                "-drive", f"file={self.disk},format=raw,if=virtio",
                "-netdev", f"user,id=n0,hostfwd=tcp:127.0.0.1:{http}-:{HTTP_PORT},"
                f"hostfwd=tcp:127.0.0.1:{https}-:{HTTPS_PORT},hostfwd=tcp:127.0.0.1:{ssh}-:22",
                "-device", "virtio-net-pci,netdev=n0,bus=pcie.0,addr=0x3",
                "-display", "none", "-monitor", "none", "-serial", f"file:{self.log_path}"]
        say("starting: " + " ".join(argv))
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.work / "qemu.stderr", "ab"))
        if self.cpu_quota:
            from image.cpu_quota import CpuQuota, QuotaUnavailable

            try:
                self._quota = CpuQuota(self.proc.pid, self.cpu_quota, f"everycycle-boot-{self.proc.pid}")
            except (QuotaUnavailable, OSError) as exc:
                raise CheckFailed(f"--cpu-quota: {exc}") from None
            say(f"qemu limited to {self.cpu_quota:g}% of one CPU ({self._quota.group})")

    def power_cut(self) -> None:
        """Pull the plug: qemu is killed, nothing is flushed or shut down."""
        self.proc.kill()
        self.proc.wait()

    def _copy_to_esp(self, bundle: Path, esp_offset: int) -> None:
        target = f"{self.disk}@@{esp_offset}"
        env = dict(os.environ, MTOOLS_SKIP_CHECK="1")
        subprocess.run(["mmd", "-i", target, "::/everycycle"], check=True, env=env)
        subprocess.run(["mcopy", "-i", target, "-s", *[str(p) for p in bundle.iterdir()], "::/everycycle/"],
                       check=True, env=env)

    def stop(self) -> float | None:
        def poweroff():
            try:
                self.ssh("systemctl poweroff", timeout=15)
            except subprocess.TimeoutExpired:
                pass  # the connection may die with the box; the wait below decides

        try:
            return stop_process(self.proc, 120, ask=poweroff) if getattr(self, "proc", None) else None
        finally:
            if self._quota is not None:
                self._quota.lift()


# ---- the checks ----

def http_get(url: str, timeout: float = 5, *, context=None, key: str | None = None) -> tuple[int, str]:
    """GET without following redirects: (status, body) for every status; OSError (HTTPFailure) for no answer."""
    answer = http_client.get(url, timeout=timeout, verify=context if context is not None else True,
                             headers={"Authorization": f"Bearer {key}"} if key else {})
    return answer.status, answer.text()


def trusting(ca_pem: str):
    """Trust exactly the box's local CA, as a client told to by `everycycle front ca` does (names checked)."""
    import ssl

    return ssl.create_default_context(cadata=ca_pem)


def pem_fingerprint(pem: str) -> str:
    import ssl

    digest = hashlib.sha256(ssl.PEM_cert_to_DER_cert(pem)).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def check_front(box: Box, result: dict) -> None:
    """As an owner's client: the box's local CA fetched over plain HTTP and checked against the fingerprint the box
    shows (`everycycle front ca`), then HTTPS trusting that CA alone, names checked (the certificate it issued names
    the address the box has); the served certificate is the one `everycycle front fingerprint` shows; plain HTTP
    only redirects; /metrics needs a key. Sets box.tls (the trusting context) for the checks that follow."""
    import ssl
    from urllib.parse import urlsplit

    shown = box.ssh("everycycle front ca --state-dir /etc/everycycle").stdout.splitlines()
    ca_print = next((line.split()[-1] for line in shown if line.startswith("SHA-256")), None)
    try:
        result["ca_fingerprint"] = pem_fingerprint(trust_box_ca(box))
    except OSError as exc:
        raise CheckFailed(str(exc)) from None
    if result["ca_fingerprint"] != ca_print:
        raise CheckFailed(f"the CA fetched in clear ({result['ca_fingerprint']}) is not the one the box shows "
                          f"({ca_print})")
    # The certificate names the box's addresses as the front last saw them: one given after it started is
    # named within its next check (5 s).
    wait_until(box, "HTTPS trusting the box's CA", time.monotonic() + 20,
               lambda: http_get(box.https_base + "/health", context=box.tls)[0] == 200)
    served = urlsplit(box.https_base)
    pem = ssl.get_server_certificate((served.hostname, served.port), timeout=10)
    result["tls_fingerprint"] = pem_fingerprint(pem)
    leaf = box.ssh("everycycle front fingerprint --state-dir /etc/everycycle").stdout.split()
    if not leaf or leaf[0] != result["tls_fingerprint"]:
        raise CheckFailed(f"the front serves certificate {result['tls_fingerprint']}, the box shows {leaf}")
    status, _ = http_get(box.http_base + "/v1/models")
    result["http_redirects"] = status == 308
    if status != 308:
        raise CheckFailed(f"plain HTTP answered /v1/models with {status}, not a redirect to HTTPS")
    status, _ = http_get(box.https_base + "/metrics", context=box.tls)
    if status != 401:
        raise CheckFailed(f"/metrics without a key answered {status}, not 401")
    say(f"front: HTTPS trusting the box's CA {ca_print[:23]}... fetched in clear (names checked), certificate "
        f"{result['tls_fingerprint'][:23]}..., HTTP redirects, /metrics needs a key")


def wait_until(box: Box, what: str, deadline: float, probe, explain=None):
    """probe() until it returns something true. On a timeout, explain() (if given) says what the box looked like,
    before the console's tail."""
    last = None
    while time.monotonic() < deadline:
        if not box.alive():
            raise CheckFailed(f"the box stopped while waiting for {what}; its console:\n{box.log_tail()}")
        try:
            value = probe()
            if value:
                return value
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            last = exc
        time.sleep(1)
    seen = ""
    if explain is not None:
        try:
            seen = f"; {explain()}"
        except (OSError, subprocess.TimeoutExpired, ValueError) as exc:
            seen = f"; could not look: {exc}"
    raise CheckFailed(f"timed out waiting for {what} (last error: {last}){seen}; the console:\n{box.log_tail()}")


def wait_ready(box: Box, t0: float, result: dict) -> dict:
    """/ready's verdict once it is 200. No fixed wait: the box keeps its time while its verdict shows progress
    (loading, the first canary, decode calls completing) and fails once the engine reports itself wedged or
    shows no progress past the limit (host_runtime/engine/readiness.py). Each change of state is recorded."""
    from host_runtime.engine.readiness import ReadyDeadline

    watch = ReadyDeadline()
    states: list[dict] = result.setdefault("ready_states", [])
    while True:
        if not box.alive():
            raise CheckFailed(f"the box stopped while waiting for /ready; its console:\n{box.log_tail()}")
        try:
            status, body = http_get(box.https_base + "/ready", context=box.tls, timeout=30)
            doc = json.loads(body)
        except (OSError, ValueError):
            status, doc = None, None
        watch.observe(doc)
        # Each change of state, and each step of loading (placement, weights, context, warm-up).
        if doc and (not states or states[-1]["state"] != doc.get("state")
                    or (doc.get("state") == "loading" and states[-1]["reason"] != doc.get("reason"))):
            states.append({"at_s": round(time.monotonic() - t0, 1), "state": doc.get("state"),
                           "reason": doc.get("reason")})
            say(f"/ready {status}: {doc.get('reason')}")
        if status == 200:
            return doc
        why = watch.failed()
        if why:
            raise CheckFailed(f"/ready: {why}; the console:\n{box.log_tail()}")
        time.sleep(2)


IMAGE_DEBIAN = "13"
VULKAN_PACKAGES = ("libvulkan1", "mesa-vulkan-drivers")


def backend_info(metrics_text: str) -> dict[str, str]:
    """The labels of everycycle_backend_info: which backend serves, on what, and why."""
    from host_runtime.common.prometheus_text import metric_samples

    return next((labels for labels, _ in metric_samples(metrics_text, "everycycle_backend_info")), {})


def check_backends(box: Box, result: dict) -> None:
    """Debian 13; the Vulkan loader and Mesa's drivers installed; llama.cpp built with Vulkan; and the backend
    the box chose: the CPU where it has no GPU (nspawn, qemu), with the reason in /metrics."""
    os_release = box.ssh(". /etc/os-release; echo $VERSION_ID $VERSION_CODENAME").stdout.split()
    result["os"] = " ".join(os_release)
    if os_release[:1] != [IMAGE_DEBIAN]:
        raise CheckFailed(f"the image is {result['os']!r}, not Debian {IMAGE_DEBIAN}")
    pkgs = box.ssh("dpkg-query -W -f='${Package} ${Version}\\n' " + " ".join(VULKAN_PACKAGES))
    result["vulkan_packages"] = pkgs.stdout.split("\n")[:-1]
    if pkgs.returncode != 0 or len(result["vulkan_packages"]) != len(VULKAN_PACKAGES):
        raise CheckFailed(f"the Vulkan loader or Mesa's drivers are missing: {pkgs.stdout}{pkgs.stderr}")
    built = box.ssh("/opt/everycycle/venv/bin/python -c 'from host_runtime.gpu.llama_devices import "
                    "compiled_backends; print(\",\".join(compiled_backends()))' 2>/dev/null")
    result["llama_backends"] = built.stdout.strip()
    if "Vulkan" not in result["llama_backends"].split(","):
        raise CheckFailed(f"the image's llama.cpp has no Vulkan backend: {built.stdout}{built.stderr}")
    chosen = backend_info(http_get(box.https_base + "/metrics", context=box.tls, key=box.api_key)[1])
    result["backend"] = chosen
    say(f"Debian {result['os']}; llama.cpp backends {result['llama_backends']}; serving on {chosen}")
    if chosen.get("backend") != "cpu" or "no GPU" not in chosen.get("reason", ""):
        raise CheckFailed(f"with no GPU the box should serve from the CPU and say why; /metrics says {chosen}")


NVIDIA_PACKAGES = ("nvidia-kernel-dkms", "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1", "nvidia-smi",
                   "nvidia-modprobe", "libcudart12", "libcublas12", "libcublaslt12", "nvidia-vulkan-icd")
CUDA_LIB = "/opt/everycycle/llama-cuda/lib"


def check_nvidia(box: Box, result: dict, required: bool) -> None:
    """The NVIDIA pieces of `make image` (image/mkosi.nvidia.conf): the driver's packages, its kernel module
    built for the kernel that booted, and the CUDA build of llama.cpp with every library it links found. There
    is no NVIDIA card under qemu, so the box must say it serves from the CPU because no driver answered."""
    present = box.ssh(f"test -e {CUDA_LIB}/libggml-cuda.so").returncode == 0
    result["nvidia"] = {"cuda_build": present}
    if not present:
        if required:
            raise CheckFailed(f"no CUDA build of llama.cpp at {CUDA_LIB} (built with NVIDIA=0?)")
        return
    pkgs = box.ssh("dpkg-query -W -f='${Package} ${Version}\\n' " + " ".join(NVIDIA_PACKAGES))
    result["nvidia"]["packages"] = pkgs.stdout.split("\n")[:-1]
    if pkgs.returncode != 0 or len(result["nvidia"]["packages"]) != len(NVIDIA_PACKAGES):
        raise CheckFailed(f"NVIDIA packages missing: {pkgs.stdout}{pkgs.stderr}")
    mod = box.ssh("modinfo -k $(uname -r) -F version nvidia-current; modinfo -k $(uname -r) -F filename nvidia-current")
    result["nvidia"]["kernel_module"] = mod.stdout.split()
    if mod.returncode != 0 or not mod.stdout.strip():
        raise CheckFailed(f"no nvidia kernel module for the running kernel: {mod.stdout}{mod.stderr}")
    ldd = box.ssh(f"ldd {CUDA_LIB}/libggml-cuda.so {CUDA_LIB}/libllama.so")
    missing = [line.strip() for line in ldd.stdout.splitlines() if "not found" in line]
    result["nvidia"]["cuda_libs_resolved"] = ldd.returncode == 0 and not missing
    if not result["nvidia"]["cuda_libs_resolved"]:
        raise CheckFailed(f"the CUDA build's libraries do not all resolve: {missing or ldd.stderr}")
    reason = result.get("backend", {}).get("reason", "")
    if "not CUDA: no NVIDIA driver answered" not in reason:
        raise CheckFailed(f"with no NVIDIA card the backend's reason should say no driver answered: {reason!r}")
    say(f"NVIDIA: module {' '.join(result['nvidia']['kernel_module'])}; the CUDA build's libraries resolve")


def trust_box_ca(box: Box) -> str:
    """The box's local CA as an owner's client first gets it, over plain HTTP (its PEM); box.tls then trusts it
    alone. OSError where the box does not serve it."""
    status, ca_pem = http_get(box.http_base + "/ca.crt", timeout=10)
    if status != 200:
        raise OSError(f"the box's CA fetched in clear: HTTP {status}")
    box.tls = trusting(ca_pem)
    return ca_pem


def box_system(box: Box) -> dict:
    """The running version, slot and last update, as /health shows them to a key (without one it says only that
    the box is up): over HTTPS, trusting the box's local CA (fetched in clear, as check_front checks)."""
    if getattr(box, "tls", None) is None:
        trust_box_ca(box)
    status, body = http_get(box.https_base + "/health", context=box.tls, key=box.api_key, timeout=10)
    return json.loads(body).get("system", {}) if status == 200 else {}


def check_slots(box: Box, result: dict) -> None:
    """A disk boots from root slot A with its version, shown in /health; slot B waits empty for an update."""
    system = box_system(box)
    result["system"] = system
    parts = box.ssh("lsblk -rno PARTLABEL,MOUNTPOINTS $(findmnt -nvo SOURCE /) $(findmnt -nvo SOURCE /var)").stdout
    result["mounted_partitions"] = parts.split()
    say(f"running {system.get('version')} from slot {system.get('slot')}; mounted: {' '.join(parts.split())}")
    if system.get("slot") not in ("A", "B") or system.get("version", "").startswith("unavailable"):
        raise CheckFailed(f"/health should show the running version and slot: {system}")
    if f"ec_{system['version']}" not in parts.split():
        raise CheckFailed(f"the root is not the slot labelled ec_{system['version']}: {parts}")


# Only supervisord: the governor is root only where governor.toml says enforce, and the test bundle observes.
ROOT_ALLOWED = ("supervisord", "keepalived")  # keepalived: a gateway's virtual address


def parse_service_processes(text: str) -> list[tuple[str, str]]:
    """`ps -o user=,args=` lines of the services' cgroup, as (user, command line)."""
    rows = []
    for line in text.splitlines():
        if line.strip():
            user, _, args = line.strip().partition(" ")
            rows.append((user, args.strip()))
    return rows


def expected_user(args: str) -> str | None:
    """The user a program of the box's services must run as (common/service_user.py), from its command line;
    None for one this check does not know."""
    from host_runtime.common import service_user as u

    if any(a in args for a in ROOT_ALLOWED):
        return "root"
    if "nginx:" in args or " front run" in args:
        return u.FRONT_USER
    if " bmc " in args or args.endswith(" bmc"):
        return u.BMC_USER
    if " fleet gateway" in args or " fleet address" in args or "host_runtime.fleet.router_main" in args:
        return u.FLEET_USER
    if " fleet shard-host" in args:
        return u.SHARD_USER
    if any(f" {c} " in f"{args} " or f"host_runtime.cli {c}" in args for c in ("serve", "engine", "discover", "governor")):
        return u.SERVICE_USER  # the governor too: the test bundle observes
    return None


def secret_owners(stat_lines: str) -> list[str]:
    """`stat -c '%n %U %a'` of the box's secrets: what is wrong (another owner than common/service_user.py's, or
    a mode that lets others read)."""
    from host_runtime.common.service_user import owner_of

    wrong = []
    for line in stat_lines.splitlines():
        path, user, mode = line.rsplit(" ", 2)
        want = owner_of(path.lstrip("/"))
        if want and (user != want or int(mode, 8) & 0o077):
            wrong.append(f"{path}: {user} {mode}, expected {want} 600")
    return wrong


def check_users(box: Box, result: dict) -> None:
    """No program of the box's services runs as root but supervisord (the governor too, only to enforce), each
    runs as its own service's user, each secret is its reader's alone, and the engines' user reads none of the
    others' (hardening #35 item 6)."""
    out = box.ssh("for p in $(ls /proc | grep -E '^[0-9]+$'); do grep -qs everycycle-supervisord.service "
                  "/proc/$p/cgroup && ps -o user:32=,args= -p $p; done")
    rows = parse_service_processes(out.stdout)
    result["service_users"] = sorted({user for user, _ in rows})
    as_root = [args for user, args in rows if user == "root" and not any(a in args for a in ROOT_ALLOWED)]
    from host_runtime.common.service_user import SERVICE_USERS

    strangers = sorted(set(result["service_users"]) - {*SERVICE_USERS, "root"})
    if strangers:
        raise CheckFailed(f"service programs running as users the image does not make for them: {strangers}")
    if not rows or as_root:
        raise CheckFailed(f"programs running as root that need not: {as_root or out.stdout + out.stderr}")
    misplaced = [f"{args} as {user} (expected {expected_user(args)})" for user, args in rows
                 if expected_user(args) not in (None, user)]
    if misplaced:
        raise CheckFailed("programs running as another service's user: " + "; ".join(misplaced))
    stats = box.ssh("stat -c '%n %U %a' /etc/everycycle/tls/*.key /etc/everycycle/api_keys.json "
                    "/etc/everycycle/bmc.password /etc/everycycle/fleet.key /etc/everycycle/shard-wire.key "
                    "/etc/everycycle/shard-holder.keys 2>/dev/null").stdout
    result["secrets"] = stats.splitlines()
    if wrong := secret_owners(stats):
        raise CheckFailed("secrets not their service's alone: " + "; ".join(wrong))
    leaked = box.ssh("runuser -u everycycle -- cat /etc/everycycle/tls/box.key")
    if leaked.returncode == 0 or "BEGIN" in leaked.stdout:
        raise CheckFailed("the engines' user (everycycle) reads the front's TLS key")
    result["engine_user_reads_tls_key"] = False
    # The run directory is root's: the engines' user cannot move the front's folder aside (#56, item 2).
    run_dir = box.ssh("stat -c '%U %a' /run/everycycle").stdout.strip()
    moved = box.ssh("runuser -u everycycle -- mv /run/everycycle/front /run/everycycle/front.planted")
    result["run_dir"] = run_dir
    if moved.returncode == 0 or not run_dir.startswith("root "):
        raise CheckFailed(f"/run/everycycle is '{run_dir}': the engines' user (everycycle) "
                          f"{'moved' if moved.returncode == 0 else 'may move'} the front's folder")
    say(f"service users: {result['service_users']}, each program its own service's; as root: supervisord only "
        f"({len(rows)} processes); secrets: {', '.join(result['secrets'])}; everycycle cannot read the TLS key nor "
        f"move the front's run folder (/run/everycycle: {run_dir})")


def check(box: Box, t0: float, timeout: float, nvidia_required: bool = False) -> dict:
    result: dict = {}
    deadline = t0 + timeout
    wait_until(box, "/health", deadline, lambda: http_get(box.http_base + "/health")[0] == 200)
    result["boot_to_health_s"] = round(time.monotonic() - t0, 1)
    say(f"/health answered after {result['boot_to_health_s']} s")
    check_front(box, result)
    ready = wait_ready(box, t0, result)
    result["boot_to_ready_s"] = round(time.monotonic() - t0, 1)
    result["ready"] = ready
    say(f"/ready after {result['boot_to_ready_s']} s: {ready['reason']}")

    import httpx2
    from openai import AuthenticationError, OpenAI

    client = OpenAI(base_url=box.https_base + "/v1", api_key=box.api_key, timeout=600, max_retries=0,
                    http_client=httpx2.Client(verify=box.tls, timeout=600))
    try:
        OpenAI(base_url=box.https_base + "/v1", api_key="ec-wrong", max_retries=0,
               http_client=httpx2.Client(verify=box.tls)).models.list()
        raise CheckFailed("a wrong API key was accepted")
    except AuthenticationError:
        result["wrong_key_rejected"] = True
    model = client.models.list().data[0].id
    t1 = time.monotonic()
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What is 2+2?"}],
                                          max_tokens=12, temperature=0)
    text = chat.choices[0].message.content or ""
    result["completion"] = {"model": model, "text": text, "completion_tokens": chat.usage.completion_tokens,
                            "seconds": round(time.monotonic() - t1, 2)}
    say(f"chat completion from {model}: {text!r}")
    if not text.strip() or chat.usage.completion_tokens < 1:
        raise CheckFailed(f"the completion was empty: {chat}")

    def all_running():
        out = box.ssh("supervisorctl status")
        states = parse_supervisor_status(out.stdout)
        result["supervisor"] = states
        return states if set(states) >= EXPECTED_PROGRAMS and all(v == "RUNNING" for v in states.values()) else None

    try:
        wait_until(box, "every supervisord program RUNNING", time.monotonic() + 90, all_running)
    except CheckFailed as exc:
        raise CheckFailed(f"supervisorctl status: {result.get('supervisor')}\n{exc}") from None
    say(f"supervisorctl status: {result['supervisor']}")
    failed = box.ssh("systemctl --failed --plain --no-legend").stdout.strip()
    result["failed_units"] = failed.splitlines()
    result["system_state"] = box.ssh("systemctl is-system-running").stdout.strip()
    say(f"systemctl --failed: {failed or '(none)'}; system {result['system_state']}")
    if failed:
        detail = box.ssh("systemctl status --no-pager --lines=15 " + " ".join(unit.split()[0] for unit in failed.splitlines()))
        raise CheckFailed(f"failed units:\n{failed}\n{detail.stdout}")
    # The console owns tty1 on a machine that has one (qemu); a container has none and skips it.
    result["console_tty1"] = box.ssh("systemctl is-active everycycle-console.service").stdout.strip()
    if box.has_tty1 and result["console_tty1"] != "active":
        raise CheckFailed(f"the console on tty1 is {result['console_tty1']}")
    if getattr(box, "data_min_bytes", None):
        size = int(box.ssh("df -B1 --output=size /var | tail -1").stdout.strip() or 0)
        result["data_fs_bytes"] = size
        if size < box.data_min_bytes:
            raise CheckFailed(f"the data partition (/var) did not grow over the disk: {size} bytes, expected at "
                              f"least {box.data_min_bytes}")
        check_slots(box, result)
    check_backends(box, result)
    check_nvidia(box, result, nvidia_required)
    check_users(box, result)
    record = box.ssh("cat /var/lib/everycycle/provisioned.json; hostname")
    if record.returncode != 0 or box.hostname not in record.stdout.splitlines()[-1:]:
        raise CheckFailed(f"the first boot did not apply the bundle: {record.stdout}{record.stderr}")
    result["first_boot_applied"] = True
    if isinstance(box, NspawnBox):
        check_shard_host(box, result)
        check_address_change(box, result)  # last: the box's first address (SSH's) is gone after it
    return result


def check_shard_host(box: NspawnBox, result: dict) -> None:
    """The bundle made the box a fleet member lending its devices (#60): from here, as a holder would, through
    stunnel's TLS keyed from the fleet key, llama.cpp's RPC server answers its HELLO and the box says what it
    lends; another fleet's key gets nothing."""
    from host_runtime.shard.errors import ShardError
    from host_runtime.shard.facts import ask
    from host_runtime.shard.holder import ShardConfig, Shards
    from host_runtime.shard.probe import hello

    member = f"{box.box_ip}:{SHARD_PORT}"

    def reach(key_file: Path) -> tuple:
        shards = Shards(ShardConfig(hosts=(member,), key_file=str(key_file)))
        try:
            rpc, facts = shards.members[member]
            return hello("127.0.0.1", rpc, member=member), ask("127.0.0.1", facts, member=member)
        finally:
            shards.stop()

    def answered():
        try:
            return reach(box.fleet_key)
        except ShardError as exc:
            result["shard_host_error"] = str(exc)
            return None

    version, (lent, link) = wait_until(box, f"the shard host at {member}", time.monotonic() + 60, answered)
    result["shard_host"] = {"member": member, "rpc_protocol": list(version),
                            "lends": [f"{d.name} {d.lend_bytes >> 20} MiB" for d in lent],
                            "round_trip_ms": link.round_trip_ms}
    stranger = box.work / "stranger.key"
    stranger.write_text(secrets.token_urlsafe(32) + "\n")
    stranger.chmod(0o600)
    try:
        reach(stranger)
    except ShardError:
        result["shard_host"]["other_key_refused"] = True
    else:
        raise CheckFailed(f"the shard host at {member} answered a peer with another fleet's key")
    say(f"shard host {member}: RPC protocol {'.'.join(map(str, version))}, lends {', '.join(result['shard_host']['lends'])}; "
        "another fleet's key refused")


def check_address_change(box: NspawnBox, result: dict) -> None:
    """As a new DHCP lease would: the box's address changes (the new one given, the old one taken away, in the
    box's own network namespace), and a client that trusts only the box's local CA connects at the new address,
    names checked, within the front's address check and a reload (#37: a new lease broke every client that
    connected by IP)."""
    from host_runtime.front.run import ADDRESS_CHECK_S

    host_ip, box_ip = box.moved
    run = lambda *a: subprocess.run(list(a), check=True, capture_output=True, text=True)  # noqa: E731
    run("ip", "addr", "add", f"{host_ip}/30", "dev", box.host_if)
    run("ip", "netns", "exec", box.netns, "ip", "addr", "add", f"{box_ip}/30", "dev", "eth0")
    run("ip", "netns", "exec", box.netns, "ip", "addr", "del", f"{box.box_ip}/30", "dev", "eth0")
    started = time.monotonic()
    wait_until(box, "HTTPS at the box's new address, trusting its CA", started + ADDRESS_CHECK_S + 25,
               lambda: http_get(f"https://{box_ip}:{HTTPS_PORT}/health", context=box.tls)[0] == 200)
    result["address_change"] = {"from": box.box_ip, "to": box_ip, "trusted_after_s": round(time.monotonic() - started, 1)}
    say(f"address {box.box_ip} -> {box_ip}: a client trusting only the box's CA connects there after "
        f"{result['address_change']['trusted_after_s']} s (names checked)")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["nspawn", "qemu"])
    ap.add_argument("image", type=Path, help="the directory image (nspawn) or the raw disk (qemu)")
    ap.add_argument("--timeout", type=float, help="seconds from start to /health (default 300 for nspawn, 900 for "
                                                   "qemu); /ready then gets as long as the box shows progress")
    ap.add_argument("--nvidia", action="store_true", help="require the NVIDIA driver and the CUDA build (make image's "
                                                          "default); without it they are checked where present")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs, bundle) afterwards")
    ap.add_argument("--cpu-quota", type=float, metavar="PERCENT",
                    help="qemu: limit the emulator to this share of one host CPU (a slow box: readiness must wait "
                         "for it, not call it wedged)")
    ap.add_argument("--slow-canary", type=float, metavar="S",
                    help="fail unless /ready's canary took at least S seconds (shows that --cpu-quota made the box "
                         "as slow as intended: past the 10 s that once counted as wedged)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("boot_check: needs root (network namespaces, nspawn)", file=sys.stderr)
        return 2
    if not args.image.exists():
        print(f"boot_check: {args.image} does not exist: build it first (make image / make image-dir)",
              file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="everycycle-boot-"))
    box = NspawnBox(work) if args.kind == "nspawn" else QemuBox(work)
    if args.cpu_quota:
        if args.kind != "qemu":
            ap.error("--cpu-quota: qemu only")
        box.cpu_quota = args.cpu_quota
    summary: dict = {"kind": args.kind, "image": str(args.image.resolve()), "cpu_quota_percent": args.cpu_quota}

    def body() -> None:
        t0 = time.monotonic()
        box.start(args.image)
        summary.update(check(box, t0, args.timeout or (300 if args.kind == "nspawn" else 900), args.nvidia))
        canary = summary["ready"].get("canary_s") or 0.0
        if args.slow_canary and canary < args.slow_canary:
            raise CheckFailed(f"the canary took {canary:.1f} s, not the {args.slow_canary:g} s asked for: lower "
                              "--cpu-quota")

    return run_and_report(box, work, summary, body, keep=args.keep)


def run_and_report(box: Box, work: Path, summary: dict, body, keep: bool = False, cleanup=lambda: None) -> int:
    """Run `body` against the box; whatever happens, stop the box, print the JSON summary, keep the work
    directory where asked or where something failed. The exit status: 0 when every check passed."""
    ok = False
    try:
        body()
        ok = True
    except (CheckFailed, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None)
        summary["error"] = f"{exc}{': ' + detail if detail else ''}"
        say(f"FAILED: {summary['error']}")
    except Exception as exc:  # an unexpected error still gets the box stopped and its console shown
        summary["error"] = f"{type(exc).__name__}: {exc}"
        say(f"FAILED: {summary['error']}\n{box.log_tail() if hasattr(box, 'log_path') else ''}")
    finally:
        cleanup()
        took = box.stop()
        summary["shutdown_s"] = round(took, 1) if took is not None else None
        if keep or not ok:
            summary["work_dir"] = str(work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    summary["ok"] = ok
    print(json.dumps(summary, indent=2), flush=True)
    if not ok:
        # last, so that a CI log's tail (which may show a few lines only) names what failed, not just "ok": false
        first = (summary["error"].splitlines() or [""])[0]
        say(f"FAILED (the box's work directory {work}): {first[:1500]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
