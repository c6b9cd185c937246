"""The engine process: loads the model, runs the loop, answers workers on a Unix socket."""

from __future__ import annotations

import logging
import os
import queue
import socket
import socketserver
import threading
import time
from pathlib import Path

from host_runtime.common.sockets import peer_closed
from host_runtime.engine.engine import EmbeddingCancelled, Engine, GenerationRequest, PrefixCacheConfig
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import LineReader, send_message
from host_runtime.engine.model import ContextConfig, LoadedModel, ModelLoadError, model_id_for
from host_runtime.engine.prompt import PromptBuilder
from host_runtime.engine.sampling import GrammarRejected, SamplingParams, check_grammar

log = logging.getLogger(__name__)

CANARY_PROMPT = "The capital of France is"
EVENT_POLL_S = 0.05  # how often a waiting handler checks whether its worker hung up


class EngineService:
    def __init__(self, model_path: str, config: ContextConfig, prefix_cache: PrefixCacheConfig = PrefixCacheConfig(),
                 governor_state: str | None = None):
        self.model_path = model_path
        self.config = config
        self.prefix_cache = prefix_cache
        self.governor_state = governor_state
        self.model_id = model_id_for(model_path)
        self.state = "loading"
        self.state_reason = "loading the model"
        self.model: LoadedModel | None = None
        self.engine: Engine | None = None
        self.prompts: PromptBuilder | None = None
        self._canary_lock = threading.Lock()
        self._canary_ok_at = 0.0

    def load(self) -> None:
        started = time.monotonic()
        try:
            self.model = LoadedModel(self.model_path, self.config)
            self.prompts = PromptBuilder(self.model)
            self.engine = Engine(self.model, max_waiting=self.model.capacity.max_waiting,
                                 prefix_cache=self.prefix_cache, governor_state=self.governor_state)
            self.engine.start()
        except ModelLoadError as exc:
            self.state, self.state_reason = "failed", str(exc)
            log.error("%s", exc)
            return
        self.state, self.state_reason = "ready", "model loaded"
        cap = self.model.capacity
        self._publish_placement()
        log.info("loaded %s in %.1fs: context %d tokens per sequence, %d sequences (KV %.0f MiB), "
                 "queue %d, %d threads", self.model_id, time.monotonic() - started, self.model.n_ctx_per_seq,
                 cap.n_parallel, cap.kv_bytes_total / 2**20, cap.max_waiting, self.model.n_threads)

    def _publish_placement(self) -> None:
        """Say where the model went and why, in the log and /metrics; warn where llama.cpp took more than planned."""
        from host_runtime.gpu.llama_build import select
        from host_runtime.gpu.llama_devices import compiled_backends, list_devices
        from host_runtime.placement.proof import tolerance
        from host_runtime.placement.render import backend_choice, prometheus_lines, render_table

        p, allocated = self.model.placement, self.model.allocation
        build = select()
        self.backend = backend_choice(p, compiled_backends(), [d.name for d in list_devices()],
                                      self.config.placement == "cpu", build.reason)
        log.info("llama.cpp build: %s (%s), from %s", build.name, build.reason, build.lib_dir or "the venv's wheel")
        log.info("backend %s on %s: %s", *self.backend)
        log.info("placement:\n%s", render_table(p, proven=True, proof_note="compute buffers from llama.cpp's dry run"))
        for s in p.gpu_shares:
            real = sum(allocated.by_device.get(s.device, {}).values())
            if real > s.used_bytes + tolerance(s.used_bytes):
                log.warning("%s: llama.cpp allocated %.0f MiB, the plan said %.0f MiB", s.device, real / 2**20,
                            s.used_bytes / 2**20)
        self.engine.metrics.placement_lines = prometheus_lines(p, allocated.by_device, self.backend)

    # ---- ops -------------------------------------------------------------------

    def info(self) -> dict:
        m = self.model
        return {"state": self.state, "reason": self.state_reason, "model_id": self.model_id,
                "n_ctx": m.n_ctx_per_seq if m else None, "n_parallel": m.n_parallel if m else None,
                "max_waiting": m.capacity.max_waiting if m else None,
                "placement": m.placement.to_json() if m else None,
                "pid": os.getpid()}

    def metrics_text(self) -> str:
        if self.engine is None:
            from host_runtime.engine.metrics import model_info_text

            return model_info_text(self.model_id, self.state)
        return self.engine.metrics.render(self.model_id, self.state)

    def readiness(self, max_age: float, deadline: float) -> dict:
        if self.state != "ready":
            return {"ready": False, "reason": self.state_reason}
        with self._canary_lock:
            if time.monotonic() - self._canary_ok_at < max_age:
                return {"ready": True, "reason": "canary passed recently"}
            events: queue.Queue = queue.Queue()
            tokens = self.prompts.completion_tokens(CANARY_PROMPT)
            canary = GenerationRequest(prompt_tokens=tokens, max_tokens=2, sink=events.put,
                                       sampling=SamplingParams(temperature=0.0, ignore_eos=True))
            started = time.monotonic()
            try:
                self.engine.submit(canary)
            except RequestRejected as exc:
                return {"ready": False, "reason": f"canary refused: {exc.message}"}
            end = started + deadline
            while True:
                left = end - time.monotonic()
                if left <= 0:
                    canary.cancel()
                    return {"ready": False, "reason": f"wedged: the canary generation did not finish within {deadline:g}s"}
                try:
                    event = events.get(timeout=left)
                except queue.Empty:
                    continue
                if event["type"] == "done":
                    self._canary_ok_at = time.monotonic()
                    return {"ready": True, "reason": f"canary finished in {self._canary_ok_at - started:.3f}s"}
                if event["type"] == "error":
                    return {"ready": False, "reason": f"canary failed: {event['error']['message']}"}

    def build_request(self, message: dict, sink) -> GenerationRequest:
        if self.state != "ready":
            raise RequestRejected(503, f"the model is not ready ({self.state_reason})", error_type="server_busy",
                                  code="model_not_ready", retry_after=5)
        prompt = message["prompt"]
        stops = list(message.get("stop") or [])
        if "messages" in prompt:
            tokens, template_stops = self.prompts.chat_tokens(prompt["messages"])
            stops += [s for s in template_stops if s not in stops]
            param = "messages"
        else:
            tokens = self.prompts.completion_tokens(prompt["text"])
            param = "prompt"
        max_tokens = self.engine.check_fits(len(tokens), message.get("max_tokens"), param)
        bias = message.get("sampling", {}).get("logit_bias") or {}
        if any(int(t) >= self.model.n_vocab for t in bias):
            raise RequestRejected(400, f"'logit_bias' names a token id past this model's vocabulary of "
                                  f"{self.model.n_vocab}", param="logit_bias")
        grammar = message.get("sampling", {}).get("grammar")
        if grammar:
            try:
                check_grammar(self.model.model, grammar)
            except GrammarRejected as exc:
                raise RequestRejected(400, f"'response_format': {exc}", param="response_format") from None
        return GenerationRequest(prompt_tokens=tokens, max_tokens=max_tokens, sink=sink,
                                 sampling=SamplingParams(**message.get("sampling", {})), stops=stops,
                                 n=int(message.get("n", 1)))

    def embed(self, message: dict, cancelled=lambda: False) -> dict:
        if self.state != "ready":
            raise RequestRejected(503, f"the model is not ready ({self.state_reason})", error_type="server_busy",
                                  code="model_not_ready", retry_after=5)
        vectors, n_tokens = self.engine.embed(list(message["inputs"]), cancelled)
        return {"type": "result", "data": vectors, "prompt_tokens": n_tokens}


class _Handler(socketserver.BaseRequestHandler):
    service: EngineService

    def handle(self) -> None:
        sock: socket.socket = self.request
        try:
            message = LineReader(sock).read()
        except (OSError, ValueError):
            return
        if not message:
            return
        op = message.get("op")
        try:
            if op == "info":
                send_message(sock, self.service.info())
            elif op == "metrics":
                send_message(sock, {"text": self.service.metrics_text()})
            elif op == "ready":
                send_message(sock, self.service.readiness(float(message.get("max_age", 5)),
                                                          float(message.get("deadline", 10))))
            elif op == "embed":
                try:
                    send_message(sock, self.service.embed(message, lambda: peer_closed(sock)))
                except EmbeddingCancelled:
                    return
                except RequestRejected as exc:
                    send_message(sock, {"type": "error", "error": exc.to_wire()})
            elif op == "generate":
                self._generate(sock, message)
            else:
                send_message(sock, {"type": "error", "error": RequestRejected(500, f"unknown engine op {op!r}").to_wire()})
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _generate(self, sock: socket.socket, message: dict) -> None:
        events: queue.Queue = queue.Queue()
        try:
            request = self.service.build_request(message, events.put)
            self.service.engine.submit(request)
        except RequestRejected as exc:
            send_message(sock, {"type": "error", "error": exc.to_wire()})
            return
        try:
            send_message(sock, {"type": "accepted", "prompt_tokens": len(request.prompt_tokens)})
            while True:
                try:
                    event = events.get(timeout=EVENT_POLL_S)
                except queue.Empty:
                    if peer_closed(sock):
                        request.cancel()
                        return
                    continue
                send_message(sock, event)
                if event["type"] in ("done", "error"):
                    return
        except OSError:
            request.cancel()


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    request_queue_size = 128


def serve_engine(socket_path: str, service: EngineService) -> None:
    """Listen first (so workers can tell "loading" from "down"), then load, then serve until killed."""
    path = Path(socket_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        path.unlink()
    handler = type("Handler", (_Handler,), {"service": service})
    server = _Server(str(path), handler)
    os.chmod(path, 0o600)
    thread = threading.Thread(target=server.serve_forever, name="engine-ipc", daemon=True)
    thread.start()
    log.info("engine listening on %s", path)
    service.load()
    try:
        thread.join()
    finally:
        server.server_close()
