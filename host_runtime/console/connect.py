"""How to point a client at this box (UI-free: the console's connect screen and `everycycle status --connect` both
show it): its addresses, how to trust its certificate (front/trust.py: the local CA's, fetched, then checked
against the fingerprint shown on the box), and the settings of the tools people use."""

from __future__ import annotations

from host_runtime.front.trust import TrustAnchor, trust_lines


def connect_lines(api_urls: list[str], fingerprint: str | None, anchor: TrustAnchor | None = None,
                  key_hint: str = "KEY") -> list[str]:
    if not api_urls:
        return ["no address yet: the box has no network address the front listens on"]
    roots = [_root(u) for u in api_urls]  # the status's URLs end in /v1; each tool below adds its own path
    base = roots[0]
    lines = [f"Address: {base}   (API key: {key_hint})"]
    if len(roots) > 1:
        lines.append("  also: " + "  ".join(roots[1:]))
    if base.startswith("https://") and fingerprint and anchor:
        lines += trust_lines(anchor, fingerprint)
    lines += [
        "Tools:",
        f"  Claude Code:  ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN={key_hint} claude",
        f"  OpenAI clients, opencode, aider, Continue:  base URL {base}/v1, API key {key_hint}",
        f"  Codex CLI:  a model provider with base_url = \"{base}/v1\", wire_api = \"responses\"",
        f"  Ollama clients (Open WebUI, Continue's ollama provider):  {base} with the key as bearer",
        f"  Editor autocomplete (llama.vim, llama.vscode):  {base}/infill (a code model with FIM tokens)",
    ]
    return lines


def _root(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url
