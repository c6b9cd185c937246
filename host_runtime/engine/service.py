"""The engine process: loads the model, runs the loop, answers workers on a Unix socket."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from pathlib import Path

from host_runtime.common.sockets import peer_closed
from host_runtime.engine import usage_file, wire
from host_runtime.engine.engine import EmbeddingCancelled, Engine, GenerationRequest
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import send_message
from host_runtime.engine.ipc_server import RequestHandler, serve_socket
from host_runtime.engine.key_ledger_file import LEDGER_NAME, SharedKeyLedger
from host_runtime.engine.metrics import model_info_text
from host_runtime.engine.model import LoadedModel, ModelLoadError, model_id_for
from host_runtime.engine.options import EngineOptions
from host_runtime.engine.prefix_cache import scope_marker
from host_runtime.engine.projector import Projector
from host_runtime.engine.prompt import PromptBuilder
from host_runtime.engine.readiness import CanaryRecord, Verdict, judge
from host_runtime.engine.sampling import CompiledGrammar, GrammarRejected
from host_runtime.engine.wire import SamplingParams
from host_runtime.gpu.llama_build import select
from host_runtime.gpu.llama_devices import compiled_backends, list_devices
from host_runtime.placement.projector_file import read_projector, with_projector_room
from host_runtime.placement.proof import tolerance
from host_runtime.placement.render import backend_choice, prometheus_lines, render_table
from host_runtime.shard.errors import ShardError
from host_runtime.shard.holder import Shards

log = logging.getLogger(__name__)

CANARY_PROMPT = "The capital of France is"
EVENT_POLL_S = 0.05  # how often a waiting handler checks whether its worker hung up


SHARD_RETRY_S = 5.0


class EngineService:
    def __init__(self, options: EngineOptions):
        self.options = options
        self.model_path = model_path = options.model
        self.speculation = options.speculation
        self.draft_model_path = options.draft_model  # speculation.kind "draft": the drafting model's GGUF
        self.wedge = options.wedge
        self.config = options.context
        self.prefix_cache = options.prefix_cache
        self.governor_state = options.governor_state
        self.usage_file = options.usage_file
        self._usage_saver = None
        # The box's tokens by key, beside the usage files: every engine and the API count into it (#56, item 11).
        self.key_ledger = SharedKeyLedger(Path(self.usage_file).with_name(LEDGER_NAME) if self.usage_file else None)
        self.model_id = model_id_for(model_path)
        self.state = "loading"
        self.state_reason = "loading the model"
        self.model: LoadedModel | None = None
        self.shards: Shards | None = None
        self.engine: Engine | None = None
        self.prompts: PromptBuilder | None = None
        self.load_progress: float | None = None
        self.load_s: float | None = None  # start to ready, once ready (the fleet's estimate of this box's loads)
        # One canary at a time; every probe shares its result (guarded by _canary_lock).
        self._canary_lock = threading.Lock()
        self._canary_started: float | None = None
        self._canary_done = threading.Event()
        self._canary_passed_at: float | None = None
        self._canary_seconds: float | None = None
        self._canary_failure: str | None = None
        self._canaries = 0

    def load(self) -> None:
        started = time.monotonic()
        try:
            if self.options.shards.hosts:
                self.shards = self._reach_shard_hosts()
            # The layers leave the projector room on the GPU libmtmd puts it on (placement/projector_file.py)
            config = with_projector_room(self.config, _projector_facts(self.options.mmproj))
            self.model = LoadedModel(self.model_path, config, on_progress=self._loading)
            projector = None
            if self.options.mmproj:
                self._loading("loading the projector")
                projector = Projector(self.options.mmproj, self.model, self.model.n_threads)
            self.prompts = PromptBuilder(self.model, projector)
            drafter = None
            if self.speculation.enabled and self.speculation.kind == "draft":
                from host_runtime.engine.draft_model import DraftModel

                drafter = DraftModel.load(self.draft_model_path, self.model, self.config, self.speculation.p_min,
                                          on_progress=lambda phase, fraction=None:
                                          self._loading(f"draft model: {phase}", fraction))
            self.engine = Engine(self.model, max_waiting=self.model.capacity.max_waiting,
                                 prefix_cache=self.prefix_cache, governor_state=self.governor_state,
                                 speculation=self.speculation, drafter=drafter, key_ledger=self.key_ledger,
                                 projector=projector)
            if self.usage_file:
                metrics = self.engine.metrics
                book = usage_file.UsageBook(self.usage_file, metrics.locked_key_usage)  # UsageFileError: stop
                metrics.key_usage.update({key: {name: counters.get(name, 0.0) for name in metrics.KEY_USAGE}
                                          for key, counters in book.loaded.items()})
                metrics.on_key_used = book.record
                book.start()
                self._usage_saver = book
            self._loading("warming up")
            warm = self.engine.start(warm_up=True)  # on the loop thread, as every later decode (Engine.start)
        except (ModelLoadError, ShardError, RuntimeError, usage_file.UsageFileError) as exc:
            self.state, self.state_reason = "failed", str(exc)
            log.error("%s", exc)
            return
        self.load_s = time.monotonic() - started
        self.state, self.state_reason = "ready", "model loaded"
        self.load_progress = 1.0
        log.info("warm-up decode: %.3fs", warm)
        cap = self.model.capacity
        self._publish_placement()
        log.info("loaded %s in %.1fs: context %d tokens per sequence, %d sequences (KV %.0f MiB), "
                 "queue %d, %d threads (%d for one-token calls)", self.model_id, self.load_s,
                 self.model.n_ctx_per_seq, cap.n_parallel, cap.kv_bytes_total / 2**20, cap.max_waiting,
                 self.model.n_threads, self.model.n_threads_decode)

    def _reach_shard_hosts(self) -> Shards:
        """Before the plan: the members' devices are devices the planner places layers on; kept for the engine's
        life (the tunnel is this process's child, ggml holds a connection to each member). A member away (or
        refusing) is waited for, its reason in /ready's 503, so the model comes back when the member does: ggml
        ends this process when a member goes away mid-generation, and its keeper starts it again into this wait."""
        shards = Shards(self.options.shards, say=self._loading)  # ShardError: no stunnel, an unreadable key
        while True:
            try:
                shards.attach()
                return shards
            except ShardError as exc:
                self.state_reason = f"waiting for the shard hosts: {exc}"
                log.warning("%s; trying again in %g s", self.state_reason, SHARD_RETRY_S)
                time.sleep(SHARD_RETRY_S)

    def save_usage(self) -> None:
        """Per-key usage to its file now, and the tokens its keys used to the box's ledger (the engine is
        stopping)."""
        if self._usage_saver is not None:
            self._usage_saver.fold()
        self.key_ledger.flush()

    def _loading(self, phase: str, fraction: float | None = None) -> None:
        """Where loading is, for /ready, /health and the console (llama.cpp's callback calls this often)."""
        size = self._model_size()
        if fraction is None:
            self.state_reason = f"loading: {phase}"
        else:
            self.load_progress = fraction
            done = f" of {size / 2**30:.2f} GiB" if size else ""
            self.state_reason = f"loading: {phase} {fraction * 100:.0f}%{done}"

    def _model_size(self) -> int:
        try:
            return os.stat(self.model_path).st_size
        except OSError:
            return 0

    def _publish_placement(self) -> None:
        """Say where the model went and why, in the log and /metrics; warn where llama.cpp took more than planned."""
        p, allocated = self.model.placement, self.model.allocation
        build = select()
        self.backend = backend_choice(p, compiled_backends(), [d.name for d in list_devices()],
                                      self.config.placement == "cpu", build.reason)
        log.info("llama.cpp build: %s (%s), from %s", build.name, build.reason, build.lib_dir or "the venv's wheel")
        log.info("backend %s on %s: %s", *self.backend)
        a = self.model.attention
        log.info("batching %s, flash attention %s, KV cache K %s V %s: %s", a.mode, a.flash, a.type_k, a.type_v,
                 a.reason)
        rows = self.model.row_bounds
        if rows.reason:  # the invariant mode's price with this model's weight types (placement/matmul_rows.py)
            (log.warning if rows.alone or not rows.held else log.info)(
                "batch invariance with this model's weights: %s%s", rows.reason,
                " (serve --mixed-batches decodes sequences together, without the guarantee)" if rows.alone else "")
        log.info("placement:\n%s", render_table(p, proven=True, proof_note="compute buffers from llama.cpp's dry run"))
        for s in p.gpu_shares:
            real = sum(allocated.by_device.get(s.device, {}).values())
            if real > s.used_bytes + tolerance(s.used_bytes):
                log.warning("%s: llama.cpp allocated %.0f MiB, the plan said %.0f MiB", s.device, real / 2**20,
                            s.used_bytes / 2**20)
        lines = prometheus_lines(p, allocated.by_device, self.backend, attention=a, rows=self.model.row_bounds)
        drafter = self.engine.drafter
        if drafter is not None:  # the draft model's own layers and bytes, beside the target's
            log.info("draft model placement:\n%s", render_table(drafter.model.placement, proven=True,
                                                                 proof_note="placed after the target"))
            lines += prometheus_lines(drafter.model.placement, drafter.model.allocation.by_device, None,
                                      prefix="draft_")
        self.engine.metrics.placement_lines = lines

    # ---- ops -------------------------------------------------------------------

    def info(self, _request: wire.Info | None = None) -> wire.EngineInfo:
        m = self.model
        figures = self.engine.metrics.snapshot() if self.engine else {}
        return wire.EngineInfo(
            state=self.state, reason=self.state_reason, model_id=self.model_id,
            model_path=str(Path(self.model_path).resolve()), pid=os.getpid(),
            busy=bool(figures.get("requests_processing") or figures.get("requests_deferred")),
            load_progress=self.load_progress, tool_format=self.prompts.tool_format if self.prompts else None,
            n_ctx=m.n_ctx_per_seq if m else None, n_ctx_train=m.model.n_ctx_train() if m else None,
            n_parallel=m.n_parallel if m else None,
            max_waiting=m.capacity.max_waiting if m else None, placement=m.placement.to_json() if m else None,
            pooling=m.pooling if m else None, recent=self.engine.metrics.recent() if self.engine else None,
            media=self.prompts.media if self.prompts else None,
            shards=self.shards.describe() if self.shards else None, load_s=self.load_s)

    def metrics_text(self, _request: wire.Metrics | None = None) -> wire.MetricsText:
        if self.engine is None:
            return wire.MetricsText(model_info_text(self.model_id, self.state))
        return wire.MetricsText(self.engine.metrics.render(self.model_id, self.state))

    def readiness(self, request: wire.Ready) -> Verdict:
        """The verdict (engine/readiness.py). Starts a canary when the last passed more than max_age ago and none
        runs; waits up to `wait` for the one running, never cancels it, and otherwise answers from progress."""
        max_age, wait = float(request.max_age), float(request.wait)
        if self.state != "ready":
            return self.verdict()
        with self._canary_lock:
            now = time.monotonic()
            stale = self._canary_passed_at is None or now - self._canary_passed_at >= max_age
            start = self._canary_started is None and (stale or self._canary_failure is not None)
            if start:  # claimed here; submitted below, outside the lock the loop thread's events take
                self._canary_started, self._canary_done = now, threading.Event()
            running, done = self._canary_started is not None, self._canary_done
        note = self._submit_canary(done) if start else None
        if running and note is None:
            done.wait(max(0.0, wait))
        return self.verdict(note)

    def _submit_canary(self, done: threading.Event) -> str | None:
        """Submit the claimed canary; its events settle the record from the loop thread. A note when refused."""
        started = self._canary_started

        def sink(event) -> None:
            if not isinstance(event, wire.FINAL):
                return
            with self._canary_lock:
                finished = time.monotonic()
                self._canary_started = None
                self._canary_seconds = finished - started
                if isinstance(event, wire.Done):
                    self._canary_passed_at, self._canary_failure = finished, None
                else:
                    self._canary_failure = event.error.message
            self.engine.metrics.canary(finished - started)
            done.set()

        canary = GenerationRequest(prompt_tokens=self.prompts.completion_tokens(CANARY_PROMPT), max_tokens=2,
                                   sink=sink, sampling=SamplingParams(temperature=0.0, ignore_eos=True))
        try:
            self.engine.submit(canary)
        except RequestRejected as exc:
            with self._canary_lock:
                self._canary_started = None
            done.set()
            return f"no canary now: {exc.message}"
        with self._canary_lock:
            self._canaries += 1
        return None

    def verdict(self, note: str | None = None) -> Verdict:
        if self.state != "ready":
            return judge(self.state, self.state_reason, None, CanaryRecord(), self.wedge, self.load_progress)
        with self._canary_lock:
            now = time.monotonic()
            record = CanaryRecord(
                running_for_s=None if self._canary_started is None else now - self._canary_started,
                passed_ago_s=None if self._canary_passed_at is None else now - self._canary_passed_at,
                last_seconds=self._canary_seconds, failure=self._canary_failure, count=self._canaries, note=note)
        return judge(self.state, self.state_reason, self.engine.progress.snapshot(), record, self.wedge,
                     self.load_progress)

    def _check_ready(self) -> None:
        if self.state != "ready":
            raise RequestRejected(503, f"the model is not ready ({self.state_reason})", error_type="server_busy",
                                  code="model_not_ready", retry_after=5)

    def _chat(self, prompt: wire.ChatPrompt):
        return self.prompts.chat(prompt.messages, prompt.tools, bool(prompt.parallel_tool_calls),
                                 prompt.template_kwargs, prompt.media)

    def build_request(self, request: wire.Generate, sink) -> GenerationRequest:
        self._check_ready()
        if self.model.pooling:
            raise RequestRejected(400, f"'{self.model_id}' is an embedding model (its GGUF declares "
                                  f"{self.model.pooling} pooling): it answers /v1/embeddings only",
                                  param="model", code="model_not_generative")
        prompt = request.prompt
        stops = list(request.stop)
        thinking = ""
        media: dict = {}
        harmony = isinstance(prompt, wire.ChatPrompt) and self.prompts.tool_format == "harmony"
        if isinstance(prompt, wire.ChatPrompt):
            rendered = self._chat(prompt)
            # A grammar (a required call, response_format) shapes the answer from its first token: no think block.
            tokens, thinking = rendered.tokens, "" if request.sampling.grammar else rendered.thinking
            media = rendered.media
            stops += [s for s in rendered.stops if s not in stops]
            param = "messages"
        elif isinstance(prompt, wire.InfillPrompt):
            tokens = self.prompts.infill_tokens(prompt.prefix, prompt.suffix, prompt.extra, prompt.after)
            param = "prompt"
        else:
            tokens = self.prompts.completion_tokens(prompt.text)
            param = "prompt"
        max_tokens = self.engine.check_fits(len(tokens), request.max_tokens, param)
        sampling = request.sampling
        if any(int(t) >= self.model.n_vocab for t in sampling.logit_bias or {}):
            raise RequestRejected(400, f"'logit_bias' names a token id past this model's vocabulary of "
                                  f"{self.model.n_vocab}", param="logit_bias")
        compiled = None
        if sampling.grammar:
            try:  # parsed once, on this handler's thread (sampling.CompiledGrammar)
                compiled = CompiledGrammar(self.model.model, sampling.grammar)
            except GrammarRejected as exc:
                raise RequestRejected(400, f"'response_format': {exc}", param="response_format") from None
        return GenerationRequest(prompt_tokens=tokens, max_tokens=max_tokens, sink=sink, sampling=sampling,
                                 stops=stops, n=int(request.n),
                                 # drafts are tokens: one copied from an image's places would be decoded as a
                                 # token id past the vocabulary
                                 speculation=bool(request.speculation) and not media, media=media,
                                 grammar=compiled, cache_scope=_cache_scope(request.cache_scope),
                                 priority=request.priority, key=request.key,
                                 key_max_concurrent=int(request.key_max_concurrent or 0),
                                 key_tokens_per_minute=int(request.key_tokens_per_minute or 0),
                                 key_tokens_per_day=int(request.key_tokens_per_day or 0), thinking=thinking,
                                 harmony=harmony)

    def count_tokens(self, request: wire.CountTokens) -> wire.TokenCount:
        """The prompt's length as the model sees it: the template rendered, then tokenized."""
        self._check_ready()
        return wire.TokenCount(len(self._chat(request.prompt).tokens))

    def tokenize(self, request: wire.Tokenize) -> wire.Tokenized:
        """llama-server's /tokenize (special markup parsed)."""
        self._check_ready()
        m = self.model
        ids = m.tokenize(request.content, add_bos=bool(request.add_special) and m.add_bos(),
                         special=True) if request.content else []
        if not request.with_pieces:
            return wire.Tokenized(ids)
        pieces = []
        for t in ids:
            raw = m.token_piece(t)
            try:
                piece = raw.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(raw)  # part of a character: its bytes, as llama-server gives them
            pieces.append({"id": t, "piece": piece})
        return wire.Tokenized(pieces)

    def detokenize(self, request: wire.Detokenize) -> wire.Detokenized:
        """llama-server's /detokenize."""
        self._check_ready()
        m = self.model
        bad = [t for t in request.tokens if t >= m.n_vocab]
        if bad:
            raise RequestRejected(400, f"'tokens' has ids past this model's vocabulary of {m.n_vocab}: {bad[:5]}",
                                  param="tokens")
        return wire.Detokenized(b"".join(m.token_piece(t) for t in request.tokens).decode("utf-8",
                                                                                         errors="replace"))

    def embed(self, request: wire.Embed, cancelled=lambda: False) -> wire.Embeddings:
        self._check_ready()
        if self.model.pooling == "rank":
            raise RequestRejected(400, f"'{self.model_id}' is a reranking model: its pooling gives scores, not "
                                  "embeddings", param="model", code="model_not_embedding")
        vectors, n_tokens = self.engine.embed(list(request.inputs), cancelled)
        return wire.Embeddings(vectors, n_tokens)

    def rank(self, request: wire.Rank, cancelled=lambda: False) -> wire.Scores:
        self._check_ready()
        if self.model.pooling != "rank":
            raise RequestRejected(400, f"'{self.model_id}' is not a reranking model (its GGUF declares no rank "
                                  "pooling): load a reranker GGUF to rerank", param="model", code="model_not_reranker")
        scores, n_tokens = self.engine.rank(request.query, list(request.documents), cancelled)
        return wire.Scores(scores, n_tokens)


def _projector_facts(path: str | None):
    if not path:
        return None
    try:
        return read_projector(path)
    except (ValueError, OSError):
        return None  # unreadable: the projector's own load below says why


def _cache_scope(name) -> int | None:
    """The prefix cache's scope for a request (the serving API names it: the API key's name, or none: shared)."""
    return scope_marker(name) if isinstance(name, str) and name else None


class _Handler(RequestHandler):
    service: EngineService

    def answer(self, sock: socket.socket, request) -> None:
        try:
            if isinstance(request, wire.Generate):
                self._generate(sock, request)
            else:
                self._answer_once(sock, request)
        except EmbeddingCancelled:
            return  # its client left: nobody reads an answer

    def _answer_once(self, sock: socket.socket, request) -> None:
        """The ops answered by one reply, from the table below; a refusal is the reply's Error."""
        service = self.service
        answer = {wire.Info: service.info, wire.Metrics: service.metrics_text, wire.Ready: service.readiness,
                  wire.CountTokens: service.count_tokens, wire.Tokenize: service.tokenize,
                  wire.Detokenize: service.detokenize,
                  wire.Embed: lambda r: service.embed(r, lambda: peer_closed(sock)),
                  wire.Rank: lambda r: service.rank(r, lambda: peer_closed(sock))}.get(type(request))
        try:
            if answer is None:
                raise RequestRejected(400, f"the model '{service.model_id}' does not answer {request.op}",
                                      code="unsupported_for_model")
            reply = answer(request)
        except RequestRejected as exc:
            reply = wire.Error(exc)
        send_message(sock, wire.event_to_wire(reply))

    def _generate(self, sock: socket.socket, message: wire.Generate) -> None:
        events: queue.Queue = queue.Queue()
        try:
            request = self.service.build_request(message, events.put)
            self.service.engine.submit(request)
        except RequestRejected as exc:
            send_message(sock, wire.event_to_wire(wire.Error(exc)))
            return
        try:
            send_message(sock, wire.event_to_wire(wire.Accepted(len(request.prompt_tokens), request.thinking)))
            while True:
                try:
                    event = events.get(timeout=EVENT_POLL_S)
                except queue.Empty:
                    if peer_closed(sock):
                        request.cancel()
                        return
                    continue
                send_message(sock, wire.event_to_wire(event))
                if isinstance(event, wire.FINAL):
                    return
        except OSError:
            request.cancel()


def serve_engine(socket_path: str, service: EngineService) -> None:
    """Listen first (so workers can tell "loading" from "down"), then load, then serve until killed."""
    serve_socket(socket_path, service, _Handler)
