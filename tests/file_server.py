"""A test-made HTTP file server on 127.0.0.1: Range requests (bytes=A- and bytes=A-B), an optional delay per 256 KiB, and the Hugging Face
Hub's /OWNER/REPO/resolve/REV/PATH form, for the model store's pulls."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
import urllib.parse
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Files(http.server.ThreadingHTTPServer):
    """Serves files with Range, optionally slowly; at /OWNER/REPO/resolve/REV/PATH as the Hugging Face Hub does
    (X-Repo-Commit, ETag). Records each request's Range header."""

    daemon_threads = True

    def __init__(self, root: Path, delay_s: float = 0.0, fail_first: int = 0, host: str = "127.0.0.1",
                 redirects: dict[str, str] | None = None):
        """fail_first: answer that many GETs with 503 first (a server restarting). redirects: a path -> the
        Location a 302 sends it to. Every path asked for is kept in .paths."""
        self.root, self.delay_s, self.ranges, self.fail_first = root, delay_s, [], fail_first
        self.redirects, self.paths = redirects or {}, []
        self.models: list[dict] = []  # what the Hub's search finds (_search)
        super().__init__((host, 0), Handler)

    @property
    def base(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _file(self) -> Path | None:
        m = re.match(r"^/[^/]+/[^/]+/resolve/[^/]+/(.+)$", self.path)
        path = self.server.root / (m.group(1) if m else self.path.lstrip("/"))
        return path if path.is_file() else None

    def _headers(self, path: Path, start: int, size: int, partial: bool, end: int | None = None) -> None:
        end = size - 1 if end is None else end
        self.send_response(206 if partial else 200)
        self.send_header("Content-Length", str(end + 1 - start))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"' + _digest(path, hashlib.sha256) + '"')
        self.send_header("X-Repo-Commit", COMMIT)
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()

    def do_HEAD(self):
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        self._headers(path, 0, path.stat().st_size, False)

    def _listing(self) -> bool:
        """The Hub's /api/models/OWNER/REPO/tree/REV listing (huggingface_hub's list_repo_tree) of every file under
        the root, each with its LFS object id, the sha256, as the Hub gives a GGUF's."""
        if not re.match(r"^/api/models/[^/]+/[^/]+/tree/[^/?]+", self.path):
            return False
        files = [{"type": "file", "path": str(p.relative_to(self.server.root)), "size": p.stat().st_size,
                  "oid": _digest(p, hashlib.sha1),
                  "lfs": {"oid": _digest(p, hashlib.sha256), "size": p.stat().st_size, "pointerSize": 134}}
                 for p in sorted(self.server.root.rglob("*")) if p.is_file()]
        return self._json(files)

    def _search(self) -> bool:
        """The Hub's /api/models?search=TEXT&filter=gguf (huggingface_hub's list_models): the server's `models`
        (each {"id": "OWNER/REPO", ...}) whose id holds the text."""
        if not self.path.startswith("/api/models?"):
            return False
        asked = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        text = (asked.get("search") or [""])[0].lower()
        return self._json([m for m in self.server.models if text in m["id"].lower()])

    def _json(self, doc) -> bool:
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        return True

    def do_GET(self):
        self.server.paths.append(self.path)
        if self._listing() or self._search():
            return
        if self.path in self.server.redirects:
            self.send_response(302)
            self.send_header("Location", self.server.redirects[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        self.server.ranges.append(rng)
        if self.server.fail_first > 0:
            self.server.fail_first -= 1
            self.send_error(503)
            return
        size = path.stat().st_size
        first, _, last = rng.split("=")[1].partition("-") if rng else ("0", "", "")
        start, end = int(first), min(int(last), size - 1) if last else size - 1  # bytes=A-B as nginx reads it
        self._headers(path, start, size, bool(rng), end)
        with open(path, "rb") as f:
            f.seek(start)
            left = end + 1 - start
            try:
                while left > 0 and (chunk := f.read(min(256 << 10, left))):
                    self.wfile.write(chunk)
                    left -= len(chunk)
                    time.sleep(self.server.delay_s)
            except (BrokenPipeError, ConnectionResetError):
                pass


HASHED_UP_TO = 256 << 20  # a larger file is a sparse model's (a table, holes for weights): never pulled whole


def _digest(path: Path, kind) -> str:
    if path.stat().st_size > HASHED_UP_TO:
        return "0" * len(kind().hexdigest())
    return kind(path.read_bytes()).hexdigest()


def serve_files(root: Path, delay_s: float = 0.0, fail_first: int = 0, host: str = "127.0.0.1",
                redirects: dict[str, str] | None = None) -> Files:
    """A started server (daemon thread); call .shutdown() when done."""
    server = Files(root, delay_s, fail_first, host, redirects)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
