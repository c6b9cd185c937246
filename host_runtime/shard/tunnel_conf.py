"""stunnel's configuration for the RPC wire (pure): TLS 1.3 with the fleet's pre-shared key, nothing else.

The member's side accepts on its LAN address and connects to llama.cpp's RPC server on loopback, or, for a peer
that names FACTS_NAME as the TLS server name, to its facts (facts.py); the holder's side accepts on loopback (two
ports per member: the RPC wire and the facts) and connects to each member. Keepalive on both sockets: a member
that vanishes from the network is noticed by the kernel rather than waited on for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

from host_runtime.shard.wire_key import psk_identity

# TLS 1.3 only, PSK only (no certificate can stand in for the key). TLS 1.3's ciphersuites all have forward
# secrecy with psk_dhe_ke, which OpenSSL negotiates by default.
_TLS = ("sslVersionMin = TLSv1.3\n"
        "ciphers = PSK\n"
        "ciphersuites = TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256\n")
_KEEPALIVE = ("socket = l:SO_KEEPALIVE=1\nsocket = r:SO_KEEPALIVE=1\n"
              "socket = l:TCP_KEEPIDLE=10\nsocket = r:TCP_KEEPIDLE=10\n"
              "socket = l:TCP_KEEPINTVL=5\nsocket = r:TCP_KEEPINTVL=5\n"
              "socket = l:TCP_KEEPCNT=3\nsocket = r:TCP_KEEPCNT=3\n"
              "socket = l:TCP_NODELAY=1\nsocket = r:TCP_NODELAY=1\n")


FACTS_NAME = "facts"


@dataclass(frozen=True)
class Route:
    name: str      # a section name: letters, digits, '-'
    accept: str    # HOST:PORT stunnel listens on
    connect: str   # HOST:PORT it forwards to
    sni: str | None = None  # the holder's: the TLS server name it asks for (FACTS_NAME: the member's facts)


def _globals(log_file: str) -> str:
    # foreground: its parent (the shard host, or the engine) supervises it; no pid file, no syslog.
    return f"foreground = yes\npid =\nsyslog = no\ndebug = 4\noutput = {log_file}\n"


def server_conf(accept: str, rpc: str, facts: str, secrets_file: str, log_file: str) -> str:
    """A member's: TLS in on accept; to the RPC server at rpc, or to the facts at facts for a peer asking for
    FACTS_NAME (stunnel's SNI routing: one port for both)."""
    key = _TLS + f"PSKsecrets = {secrets_file}\n" + _KEEPALIVE
    return (_globals(log_file) + f"[lan]\naccept = {accept}\nconnect = {rpc}\n" + key
            + f"[{FACTS_NAME}]\nsni = lan:{FACTS_NAME}\nconnect = {facts}\n" + key)


def client_conf(routes: list[Route], secrets_file: str, log_file: str) -> str:
    """The holder's: plain on each route.accept (loopback), TLS out to each member's route.connect, keyed with
    that member's key (its identity in the secrets file)."""
    return _globals(log_file) + "".join(
        f"[{r.name}]\nclient = yes\naccept = {r.accept}\nconnect = {r.connect}\n" + (f"sni = {r.sni}\n" if r.sni else "")
        + _TLS + f"PSKsecrets = {secrets_file}\nPSKidentity = {psk_identity(r.connect)}\n" + _KEEPALIVE
        for r in routes)
