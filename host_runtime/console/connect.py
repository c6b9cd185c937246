"""How to point a client at this box (UI-free: the console's connect screen and `everycycle status --connect` both
show it): its address, how to trust its certificate (self-signed: fetched, then checked against the fingerprint
shown on the box), and the settings of the tools people use."""

from __future__ import annotations

from host_runtime.front.nginx_conf import CERTIFICATE_PATH


def connect_lines(api_urls: list[str], fingerprint: str | None, key_hint: str = "KEY") -> list[str]:
    if not api_urls:
        return ["no address yet: the box has no network address the front listens on"]
    base = api_urls[0].rstrip("/")
    lines = [f"Address: {base}   (API key: {key_hint})"]
    if base.startswith("https://") and fingerprint:
        lines += [
            "Trust this box's certificate once, on each client machine:",
            f"  curl -k -o everycycle.crt {base}{CERTIFICATE_PATH}",
            "  openssl x509 -noout -fingerprint -sha256 -in everycycle.crt",
            f"  must print SHA256 Fingerprint={fingerprint}",
            "  Node tools (opencode, Claude Code, Continue):  export NODE_EXTRA_CA_CERTS=$PWD/everycycle.crt",
            "  Python tools (openai, anthropic, LangChain, aider):  export SSL_CERT_FILE=$PWD/everycycle.crt"
            "  (this box's only)",
            "  Open WebUI in Docker:  -v $PWD/everycycle.crt:/box.crt:ro -e SSL_CERT_FILE=/box.crt "
            "-e REQUESTS_CA_BUNDLE=/box.crt",
        ]
    lines += [
        "Tools:",
        f"  Claude Code:  ANTHROPIC_BASE_URL={base} ANTHROPIC_AUTH_TOKEN={key_hint} claude",
        f"  OpenAI clients, opencode, aider, Continue:  base URL {base}/v1, API key {key_hint}",
        f"  Codex CLI:  a model provider with base_url = \"{base}/v1\", wire_api = \"responses\"",
        f"  Ollama clients (Open WebUI, Continue's ollama provider):  {base} with the key as bearer",
        f"  Editor autocomplete (llama.vim, llama.vscode):  {base}/infill (a code model with FIM tokens)",
    ]
    return lines
