"""The box's one HTTP client: every call to another service or box (the serving API's Unix socket, the BMC agent,
the fleet router and peers, release and model downloads, measurements) goes through here.

It is httpx2 (pydantic's httpx, which huggingface_hub and the OpenAI and Anthropic SDKs already bring into the
image): Unix sockets, timeouts, pooled connections and streamed bodies from one library instead of urllib and an
http.client subclass. Every way of getting no answer (refused, timed out, TLS, a broken reply, a bad URL) becomes
one HTTPFailure, which each caller maps to its own typed error; an answer of any status is an Answer, and the
caller decides what a status means.
"""

from __future__ import annotations

import json as jsonlib
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import httpx2

from host_runtime.common.errors import UnavailableError

# Downloads are hashed and sized as sent: a transparently decompressed body would match neither.
IDENTITY = {"Accept-Encoding": "identity"}


class HTTPFailure(UnavailableError, OSError):
    """No usable answer from `url`: `why` says what happened; `status` is set where one was answered but the caller
    asked for success (Answer.raise_for_status), with the start of its body. An OSError, as urllib's were: "the
    peer is not answering" is caught as one wherever sockets are."""

    def __init__(self, url: str, why: str, status: int | None = None, body: bytes = b""):
        super().__init__(f"{url}: {why}")
        self.url = url
        self.why = why
        self.status = status
        self.body = body


@dataclass(frozen=True)
class Answer:
    url: str
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def raise_for_status(self) -> Answer:
        if not self.ok:
            raise HTTPFailure(self.url, f"HTTP {self.status}", self.status, self.body[:300])
        return self

    def json(self):
        """The body as JSON; ValueError when it is not."""
        return jsonlib.loads(self.body)

    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Stream:
    """A response whose body is read as it arrives (read(n) as a file's, or lines); close it, or use `with`."""

    def __init__(self, url: str, response: httpx2.Response, owner: httpx2.Client | None):
        self.url = url
        self.status = response.status_code
        self.reason = response.reason_phrase
        self.headers = response.headers
        self._response = response
        self._owner = owner  # a one-shot client, closed with the stream
        self._chunks = response.iter_raw()
        self._buffer = bytearray()  # grown and trimmed in place: a 4 MiB read of small chunks copies each once

    @property
    def peer_address(self) -> str | None:
        """The address this answer came from (the connection's, after any name resolution); None where unknown."""
        stream = self._response.extensions.get("network_stream")
        addr = stream.get_extra_info("server_addr") if stream is not None else None
        return str(addr[0]) if isinstance(addr, tuple) and addr else None

    def read(self, n: int = -1) -> bytes:
        """Up to n bytes (all that is left with n < 0); b"" at the end. HTTPFailure when the body stops early."""
        try:
            while n < 0 or len(self._buffer) < n:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._buffer += chunk
        except (httpx2.HTTPError, OSError) as exc:
            raise HTTPFailure(self.url, _why(exc)) from None
        if n < 0:
            n = len(self._buffer)
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def read_some(self, n: int) -> bytes:
        """What has arrived, up to n bytes, waiting only for the next piece (b"" at the end): a caller that
        judges the rate sees a server that drips, where read(n) would wait for all n."""
        if not self._buffer:
            try:
                chunk = next(self._chunks, None)
            except (httpx2.HTTPError, OSError) as exc:
                raise HTTPFailure(self.url, _why(exc)) from None
            if chunk is None:
                return b""
            self._buffer += chunk
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def lines(self) -> Iterator[str]:
        try:
            yield from self._response.iter_lines()
        except (httpx2.HTTPError, OSError) as exc:
            raise HTTPFailure(self.url, _why(exc)) from None

    def close(self) -> None:
        self._response.close()
        if self._owner is not None:
            self._owner.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class HTTPClient:
    """One client's settings and, with pooled (the default), its kept connections: a service that polls the same
    peer holds one. `verify`: True (the system's CAs), False, or an SSLContext (the fleet's pinned peers); `uds`: a
    Unix socket every request goes to (URLs then name only the path, on http://localhost); `trust_env`: take
    proxies and CA settings from the environment (downloads from beyond the LAN may need a proxy; the box's own
    services and peers never go through one)."""

    def __init__(self, *, verify: ssl.SSLContext | bool = True, uds: str | None = None,
                 follow_redirects: bool = False, trust_env: bool = False, pooled: bool = True):
        limits = httpx2.Limits() if pooled else httpx2.Limits(max_keepalive_connections=0)
        transport = httpx2.HTTPTransport(uds=uds, verify=verify, limits=limits, trust_env=trust_env) if uds else None
        self._client = httpx2.Client(verify=verify, follow_redirects=follow_redirects, trust_env=trust_env,
                                     limits=limits, transport=transport)

    def request(self, method: str, url: str, *, body: bytes | None = None, json=None,
                headers: Mapping[str, str] | None = None, timeout: float = 30.0) -> Answer:
        """The whole answer, of any status; HTTPFailure when none came."""
        try:
            resp = self._client.request(method, url, content=body, json=json, headers=headers, timeout=timeout)
        except (httpx2.HTTPError, httpx2.InvalidURL, OSError) as exc:
            raise HTTPFailure(url, _why(exc)) from None
        return Answer(url, resp.status_code, resp.content, resp.headers)

    def get(self, url: str, **kwargs) -> Answer:
        return self.request("GET", url, **kwargs)

    def open(self, method: str, url: str, *, json=None, headers: Mapping[str, str] | None = None,
             timeout: float = 30.0) -> Stream:
        """The answer's status and headers, its body still to read (raw: no transfer decoding)."""
        return _open(self._client, None, method, url, json, headers, timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def request(method: str, url: str, *, verify: ssl.SSLContext | bool = True, uds: str | None = None,
            follow_redirects: bool = False, trust_env: bool = False, **kwargs) -> Answer:
    """One request on a client of its own (see HTTPClient.request)."""
    with HTTPClient(verify=_verify_for(url, verify, uds, follow_redirects), uds=uds, follow_redirects=follow_redirects, trust_env=trust_env,
                    pooled=False) as client:
        return client.request(method, url, **kwargs)


def get(url: str, **kwargs) -> Answer:
    return request("GET", url, **kwargs)


def open_stream(url: str, *, method: str = "GET", json=None, headers: Mapping[str, str] | None = None,
                timeout: float = 30.0, verify: ssl.SSLContext | bool = True, follow_redirects: bool = True,
                trust_env: bool = False) -> Stream:
    """A download or a streamed answer on a client of its own, closed with the stream."""
    client = HTTPClient(verify=_verify_for(url, verify, None, follow_redirects), follow_redirects=follow_redirects, trust_env=trust_env, pooled=False)
    return _open(client._client, client._client, method, url, json, headers, timeout)


def unix_get(socket_path: str, path: str, timeout: float) -> Answer:
    """GET `path` from the HTTP server on a Unix socket (the serving API's own, behind the front and without a
    key: the socket's directory admits only the box's services)."""
    try:
        return get("http://localhost" + path, uds=socket_path, timeout=timeout)
    except HTTPFailure as exc:
        raise HTTPFailure(f"{socket_path} {path}", exc.why) from None


def _verify_for(url: str, verify: ssl.SSLContext | bool, uds: str | None,
                follow_redirects: bool) -> ssl.SSLContext | bool:
    """A one-shot plain-HTTP call does not load the CAs (about 30 ms a client) for a TLS it will not speak; one
    that follows redirects might be sent to https://, and keeps them."""
    plain = uds is not None or (not follow_redirects and not url.lower().startswith("https:"))
    return False if plain else verify


def _open(client: httpx2.Client, owner: httpx2.Client | None, method: str, url: str, json,
          headers: Mapping[str, str] | None, timeout: float) -> Stream:
    try:
        request = client.build_request(method, url, json=json, headers={**IDENTITY, **(headers or {})},
                                       timeout=timeout)
        resp = client.send(request, stream=True)
    except (httpx2.HTTPError, httpx2.InvalidURL, OSError) as exc:
        if owner is not None:
            owner.close()
        raise HTTPFailure(url, _why(exc)) from None
    return Stream(url, resp, owner)


def _why(exc: BaseException) -> str:
    """What went wrong, in the words of the deepest cause (the socket's errno text, the TLS alert)."""
    cause = exc
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__
    text = str(exc) or type(exc).__name__
    deeper = str(cause)
    return deeper if deeper and deeper != text and isinstance(cause, OSError) else text
