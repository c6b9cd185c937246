"""Starting and stopping real `everycycle` processes for tests."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from host_runtime.common.processes import stop_process

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0, *, context=None, key: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post_json(url: str, doc: dict, timeout: float = 120.0) -> tuple[int, dict]:
    """POST a JSON body; (status, the JSON answer), an error's as well as a success's."""
    import json

    req = urllib.request.Request(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def http_status(url: str, **kw) -> int:
    return http_get(url, **kw)[0]


def raw_get(port: int, path: str, host: str = "127.0.0.1", timeout: float = 5.0) -> tuple[int, dict, bytes]:
    """One plain-HTTP GET without following redirects: (status, lower-cased headers, body)."""
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def metric_value(text: str, name: str) -> float:
    """The sum of a metric's samples (over its labels, `model` among them), read by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    if not values:
        raise KeyError(f"no {name} in the metrics")
    return sum(values)


def everycycle(*args: str) -> list[str]:
    return [sys.executable, "-m", "host_runtime.cli", *args]


class Proc:
    """A child process in its own process group, logged to a file, always killed at the end."""

    def __init__(self, argv: list[str], log_path: Path, env: dict | None = None):
        self.log_path = log_path
        self._log = open(log_path, "wb")
        self.popen = subprocess.Popen(argv, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True, env=env)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.popen, 15, group=True)
        self._log.close()


def wait_for(predicate, timeout: float, what: str, proc: Proc | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.popen.poll() is not None:
            raise AssertionError(f"process exited ({proc.popen.returncode}) while waiting for {what}:\n{proc.log()[-3000:]}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" +
                         (f":\n{proc.log()[-3000:]}" if proc else ""))


def ready(base: str, context=None) -> bool:
    try:
        return http_get(base + "/ready", context=context)[0] == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_serve(args: list[str], run_dir: Path, what: str, env: dict | None = None):
    """`everycycle serve ARGS` on a free loopback port (its engine's socket and log in run_dir), ready: yields
    (base URL, Proc), stopped at the end."""
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--run-dir", str(run_dir), *args), run_dir / "serve.log",
                env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 120, what, proc)
        yield base, proc
    finally:
        proc.stop()


def serve_unsized(directory: Path, endless_suffix: str):
    """A loopback HTTP server (started; .shutdown() it) of the files in `directory`, except that a path ending in
    `endless_suffix` answers 32 MiB of zeros with no Content-Length (the body ends when the connection does): a
    server that declares no size, for the download bounds' tests. Its base URL is http://127.0.0.1:PORT."""
    import http.server
    import threading

    class Unsized(http.server.SimpleHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(directory), **kwargs)

        def do_GET(self):
            if not self.path.endswith(endless_suffix):
                return super().do_GET()
            self.send_response(200)
            self.end_headers()
            try:
                for _ in range(32):
                    self.wfile.write(b"\0" * (1 << 20))
            except OSError:
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Unsized)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
