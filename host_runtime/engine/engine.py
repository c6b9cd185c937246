"""The scheduler: one loop thread decides each step (admission, the prefix cache's actions, drafts, the step's
decode calls) and has the runner (runner.py, the only caller of llama.cpp) carry it out.

Requests arrive from any thread (`submit`), wait in arrival order for free
sequence slots, join the running batch at the next step, and leave it when they
finish or are cancelled; their events (wire.py's) go to the request's own sink.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.capacity import sequences_allowed
from host_runtime.engine.key_ledger_file import SharedKeyLedger
from host_runtime.engine.kv_store import KVStore, disk_budget
from host_runtime.engine.metrics import EngineMetrics
from host_runtime.engine.options import PrefixCacheConfig
from host_runtime.engine.output import ChoiceOutput
from host_runtime.engine.parking import PARK_RAM_BYTES, ParkingSpace
from host_runtime.engine.scheduler import AGING_S, Parked, Scheduler
from host_runtime.engine.progress import DecodeProgress
from host_runtime.engine.prefix_cache import (Admission, Copy, DropDisk, DropRam, Demote, PrefixCache, Restore,
                                              Running, Spill, Trim)
from host_runtime.engine.runner import DecodePart, LlamaRunner
from host_runtime.engine.sampling import CompiledGrammar, GrammarRejected, SamplingParams
from host_runtime.engine.drafting import StepDrafter
from host_runtime.engine.speculation import DraftLength, NgramIndex, SpeculationConfig
from host_runtime.engine.step_plan import STEP_PREFILL_S, PrefillBudget, next_cut, plan_step
from host_runtime.engine.throttle import ThrottleReader
from host_runtime.engine.wire import PRIORITIES, Done, Error, Finish, Timings, Token, TokenLogprob

log = logging.getLogger(__name__)

EventSink = Callable[[Token | Finish | Done | Error], None]  # wire events, from the loop thread
# A test hook, named as such: seconds added to every decode call, to show readiness on a slow box.
TEST_DECODE_DELAY_S = float(os.environ.get("EVERYCYCLE_TEST_DECODE_DELAY_S") or 0)


@dataclass
class GenerationRequest:
    prompt_tokens: list[int]
    max_tokens: int
    sink: EventSink
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stops: list[str] = field(default_factory=list)
    n: int = 1
    speculation: bool = True  # False: this request opts out of speculative decoding
    grammar: CompiledGrammar | None = None  # sampling.grammar parsed, by submit() on the caller's thread
    cache_scope: int | None = None  # prefix_cache.scope_marker of whose prefixes it may reuse (None: shared)
    priority: str = "default"  # wire.PRIORITIES: the queue's order, and whom it may park when every slot is busy
    key: str | None = None  # the API key's name: its requests share key_max_concurrent (0: no limit)
    key_max_concurrent: int = 0
    key_tokens_per_minute: int = 0  # its key's token limits (0: none): engine/key_ledger.py
    key_tokens_per_day: int = 0
    thinking: str = ""  # how its answer starts, for a template that thinks (wire.Accepted.thinking)
    harmony: bool = False  # a chat answer in gpt-oss's channels: rewritten as it streams (engine/harmony.py)
    settled: bool = False  # answered or dropped: no longer counted against its key
    generated: int = 0  # tokens generated over its choices (its key's usage)
    arrived: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    cached_tokens: int = 0  # prompt tokens the prefix cache supplied
    open_choices: int = 0
    # Its phases (wire.Timings), on the monotonic clock: given a slot, restored, first token; time parked.
    admitted: float | None = None
    restored: float | None = None
    first_token_at: float | None = None
    parked_at: float | None = None
    parked_s: float = 0.0
    preemptions: int = 0
    cache_hit: str = ""  # wire.Timings.cache_hit
    media: dict = field(default_factory=dict)  # an image's first place in prompt_tokens -> projector.MediaChunk
    shut_out_s: float = 0.0  # time it waited or was parked while only higher classes ran (AGING_S)

    def cancel(self) -> None:
        self.cancelled.set()

    def timings(self, now: float) -> Timings:
        """Its phases as wire.Timings, ending now; a phase it never reached lasts no time."""
        admitted = self.admitted if self.admitted is not None else now
        restored = self.restored if self.restored is not None else admitted
        first = self.first_token_at if self.first_token_at is not None else now
        return Timings(queued_s=admitted - self.arrived, restore_s=restored - admitted,
                       prefill_s=max(0.0, first - restored), decode_s=max(0.0, now - max(first, restored)),
                       parked_s=self.parked_s, preemptions=self.preemptions, cache_hit=self.cache_hit)

    @property
    def class_index(self) -> int:
        return PRIORITIES.index(self.priority)

    def rank(self) -> int:
        """Its class as the queue sees it now (0 first), raised one class per AGING_S shut out."""
        return max(0, self.class_index - int(self.shut_out_s // AGING_S))


EMBED_CANCEL_POLL_S = 0.05


class EmbeddingCancelled(Exception):
    """The embedding's client went away; nothing is answered."""


@dataclass
class _EmbeddingJob:
    token_lists: list[list[int]]
    vectors: list[list[float]] = field(default_factory=list)
    error: RequestRejected | None = None
    done: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)


class Sequence:
    """One choice of one request, bound to a llama.cpp seq_id while it runs."""

    def __init__(self, engine: "Engine", request: GenerationRequest, index: int, seq_id: int, n_past: int = 0):
        self.request = request
        self.index = index
        self.seq_id = seq_id
        self.n_past = n_past  # prompt tokens already in the KV cache (a prefix cache hit)
        self.next_token: int | None = None
        # Every token it sampled, in order: the KV holds the prompt, then the first n_past - len(prompt) of these
        # (the last one sampled is never in it); the prefix cache keeps them where any_position
        self.sampled: list[int] = []
        self.output = ChoiceOutput(request.stops, request.harmony)  # its text: engine/output.py
        self.sampler = engine.runner.sampler(request.sampling, index, request.grammar)
        self.model = engine.model
        self.media_from = engine.media_from
        self.last_token_at: float | None = None
        # Speculation: the n-gram index over prompt and output (prompt lookup) or the history a draft model
        # continues (None: not that kind, or not speculating), the draft length this sequence has earned, and
        # this step's draft (tokens after next_token, verified in the same call).
        spec = engine.speculation
        self.speculating = spec.enabled and request.speculation
        self.ngrams = (NgramIndex(request.prompt_tokens, n_max=spec.n_max, n_min=spec.n_min)
                       if self.speculating and spec.kind == "ngram" else None)
        self.history = list(request.prompt_tokens) if self.speculating and spec.kind == "draft" else None
        self.draft_length = DraftLength(k_max=spec.k_max)
        self.draft: list[int] = []

    @property
    def generated(self) -> int:
        """Tokens generated for this choice."""
        return len(self.sampled)

    def is_prefilling(self) -> bool:
        return self.n_past < len(self.request.prompt_tokens)

    def next_cut(self, pos: int | None = None) -> int:
        model = self.model
        return next_cut(self.request.prompt_tokens, self.n_past if pos is None else pos, model.prefill_chunk,
                        model.boundary_tokens, self.media_from)

    def pending_tokens(self):
        if self.is_prefilling():
            return self.request.prompt_tokens[self.n_past:]
        return [self.next_token] + self.draft if self.next_token is not None else []


class Engine:
    def __init__(self, model, *, max_waiting: int = 64, prefix_cache: PrefixCacheConfig = PrefixCacheConfig(),
                 governor_state: str | None = None, speculation: SpeculationConfig = SpeculationConfig(),
                 drafter=None, runner=None, park_ram_bytes: int = PARK_RAM_BYTES,
                 key_ledger: SharedKeyLedger | None = None, projector=None, step_prefill_s: float = STEP_PREFILL_S):
        """model: its shape (engine.model.LoadedModel: n_parallel, n_batch, n_ctx_per_seq, prefill_chunk, ...);
        runner: what calls llama.cpp (runner.LlamaRunner on that model, unless a test gives a fake);
        park_ram_bytes: parked sequences' states held in RAM, the rest on disk beside the prefix cache's files;
        key_ledger: the box's tokens by key, for the keys' token limits (None: this engine's own, in memory);
        projector: the model's (engine/projector.py), for requests with images;
        step_prefill_s: while a sequence decodes, a step's prompt calls stop about this long in (step_plan.PrefillBudget)."""
        self.model = model
        self.metrics = EngineMetrics()
        self.runner = runner if runner is not None else LlamaRunner(model, on_threads=self.metrics.set_cpu_threads,
                                                                    projector=projector)
        # Token ids from here up are an image's places (projector.placeholder_tokens): never cut, decoded through
        # the projector
        self.media_from: int | None = model.n_vocab if projector is not None else None
        # One call a step where the model computes a row alike in any call (model.shape_blind); not with images,
        # whose chunks the step decodes apart from the text (_step).
        self.shape_blind = model.shape_blind and self.media_from is None
        self.speculation = speculation
        self.drafter = drafter  # draft_model.DraftModel, for speculation.kind "draft"
        # A decode call holds the decoding sequences' tokens and drafts; with mixed batches the prompt budget
        # takes the rest of the call's room.
        self.drafting = StepDrafter(speculation, step_room=model.n_batch - (0 if model.batch_invariant
                                                                            else model.prefill_budget),
                                    batch_invariant=model.batch_invariant, n_ctx_per_seq=model.n_ctx_per_seq,
                                    draft_model=drafter, max_draft=model.row_bounds.max_draft())
        self.prefill_budget = PrefillBudget(model.prefill_budget, step_prefill_s)
        self.throttle = ThrottleReader(governor_state)
        self.progress = DecodeProgress()
        self.max_waiting = max_waiting
        # _cv guards the scheduler (its queue, parked sequences and keys' counts: engine/scheduler.py) and the
        # embedding jobs; _active and the rest are the loop thread's alone.
        self._cv = threading.Condition()
        self.scheduler = Scheduler(max_waiting, time.monotonic())
        self._active: list[Sequence] = []
        self._parking = ParkingSpace(prefix_cache.directory if prefix_cache.enabled else None, park_ram_bytes)
        self.metrics.parked_bytes = self._parking.bytes_by_tier
        self._ledger = key_ledger or SharedKeyLedger(None)  # tokens each key used, for its per-minute and per-day limits
        self.store = KVStore(prefix_cache.directory if prefix_cache.enabled else None, model.cache_fingerprint)
        found = self.store.scan()
        disk = 0
        if self.store.directory is not None:
            free, total = self.store.space()
            disk = disk_budget(prefix_cache.disk_bytes, free, total, sum(n for _, n in found))
            if disk < prefix_cache.disk_bytes:
                log.warning("prefix cache: %.1f GiB on disk instead of %.1f GiB: %s has %.1f GiB free and keeps a "
                            "reserve", disk / 2**30, prefix_cache.disk_bytes / 2**30, self.store.directory,
                            free / 2**30)
        self.cache = PrefixCache(model.n_parallel, model.prefill_chunk, prefix_cache.ram_bytes, disk,
                                 prefix_cache.enabled, boundary_tokens=model.boundary_tokens,
                                 media_from=self.media_from, any_position=self.shape_blind)
        for key, nbytes in found:
            if not self.cache.found_on_disk(key, nbytes):
                self.store.drop_disk(key)  # past today's budget: not left behind as an orphan
        # The slots start empty, as this cache's do: an engine before this one on the same context left its slots'
        # KV there (a slot keeps its last conversation), which the warm-up's and the first requests' positions
        # would not follow.
        for slot_id in range(model.n_parallel):
            self.runner.forget(slot_id)
        self._publish_cache()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._warm_up_first = False
        self._warmed = threading.Event()
        self._warm_result: float | BaseException | None = None
        self._embed_jobs: collections.deque[_EmbeddingJob] = collections.deque()  # bounded like _waiting
        self._steps_owed_s = 0.0  # generation time due before the next embedding input (see _loop)

    # ---- public, any thread -------------------------------------------------

    def start(self, warm_up: bool = False) -> float | None:
        """Start the loop thread. warm_up: its first act is warm_up(), whose seconds this returns (or whose error
        it raises), so that every llama_decode of the context comes from that one thread. libgomp gives each
        thread that calls into llama.cpp its own team of threads; once it manages more threads than there are
        cores, a thread waiting at a barrier spins only briefly, then sleeps: a warm-up on the caller's thread
        made every later two-thread one-token call 32.7 ms instead of 10.1 ms (2 cores)."""
        self._warm_up_first = warm_up
        self._thread.start()
        if not warm_up:
            return None
        self._warmed.wait()
        if isinstance(self._warm_result, BaseException):
            raise self._warm_result
        return self._warm_result

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self._thread.is_alive():  # an engine never started has no loop to wait for
            self._thread.join(timeout=10)

    def warm_up(self, n_tokens: int = 16) -> float:
        """One decode of a short prompt chunk on a free slot, then forgotten, before the loop starts: the first
        call pays for paging weights in and setting up buffers, and its time (per token too) seeds the wedge
        bound before any request has run. Returns its seconds."""
        part = self.runner.warm_up_part(n_tokens)
        self.progress.call_started(len(part[2]))
        failed = None
        try:
            self.runner.decode([part])
        except RuntimeError as exc:
            failed = exc
        seconds = self.progress.call_ended()
        self.runner.forget(part[0])
        if failed is not None:
            raise RuntimeError(f"the warm-up decode failed: {failed}")
        return seconds

    def check_fits(self, n_prompt: int, max_tokens: int | None, prompt_param: str) -> int:
        """The tokens this request may generate: its max_tokens, cut to what the context leaves after the prompt
        (an agent's max_tokens of 32000 is a ceiling, not a promise: generation ends where the context does, with
        finish_reason "length", as llama-server and Ollama do). A prompt that alone does not fit is a 400."""
        n_ctx = self.model.n_ctx_per_seq
        if n_prompt == 0:
            raise RequestRejected(400, "the prompt is empty", param=prompt_param)
        if n_prompt >= n_ctx:
            raise RequestRejected(
                400,
                f"the prompt is {n_prompt} tokens but this model's context holds {n_ctx} tokens; shorten it",
                param=prompt_param, code="context_length_exceeded")
        left = n_ctx - n_prompt
        return left if max_tokens is None else min(max_tokens, left)

    def submit(self, request: GenerationRequest) -> None:
        if request.n > self.model.n_parallel:
            raise RequestRejected(400, f"n is {request.n}; this server runs at most {self.model.n_parallel} "
                                  "sequences at once", param="n")
        if request.sampling.grammar and request.grammar is None:
            # Parsed here, on the submitting thread: the loop thread only copies it into each choice's chain.
            try:
                request.grammar = self.runner.compile_grammar(request.sampling.grammar)
            except GrammarRejected as exc:
                raise RequestRejected(400, str(exc), param="response_format") from None
        if request.priority not in PRIORITIES:
            raise RequestRejected(400, f"priority must be one of {', '.join(PRIORITIES)}, got {request.priority!r}",
                                  param="priority")
        if request.key and (request.key_tokens_per_minute or request.key_tokens_per_day):
            # Outside _cv: the box's ledger may read its file (engine/key_ledger_file.py).
            refusal = self._ledger.refusal(request.key, request.key_tokens_per_minute,
                                           request.key_tokens_per_day, time.time())
            if refusal is not None:
                raise RequestRejected(429, refusal.message(request.key), code="token_limit_exceeded",
                                      retry_after=refusal.retry_after)
        with self._cv:
            try:
                self.scheduler.enqueue(request)
            except RequestRejected as refused:
                if refused.code != "concurrency_limit_exceeded":  # the queue's refusals (engine/admission.py)
                    self.metrics.add("requests_rejected_total")
                raise
            self.progress.pending(True)
            self.metrics.add("requests_total")
            self._publish_queue_locked()
            self._cv.notify_all()

    def embed(self, texts: list[str], cancelled=lambda: False) -> tuple[list[list[float]], int]:
        """Pooled (the model's pooling, else the mean), unit-length embeddings and the total token count.

        The loop thread computes them, one input between two generation steps: a decode from any other thread
        gets its own libgomp team, and while that thread lives every two-thread one-token call of the loop's
        took 30.5 ms instead of 7.2 (2 cores; see start). `cancelled()` is asked while waiting: a request
        whose client left is dropped where it stands."""
        token_lists = [self.model.tokenize(t, add_bos=self.model.add_bos(), special=False) for t in texts]
        for i, tokens in enumerate(token_lists):
            if not tokens:
                raise RequestRejected(400, f"input[{i}] is empty", param="input")
        return self._pooled(token_lists, "input", cancelled)

    def rank(self, query: str, documents: list[str], cancelled=lambda: False) -> tuple[list[float], int]:
        """A reranker's score of each document for the query (each pair pooled as embed's inputs are), and the
        total token count."""
        return self._pooled([self.model.rerank_tokens(query, d) for d in documents], "documents", cancelled,
                            lambda vectors: [v[0] for v in vectors])

    def _pooled(self, token_lists: list[list[int]], param: str, cancelled, shape=lambda vectors: vectors):
        for i, tokens in enumerate(token_lists):
            if len(tokens) > self.model.n_ctx_per_seq:
                raise RequestRejected(400, f"{param}[{i}] is {len(tokens)} tokens; the limit is "
                                      f"{self.model.n_ctx_per_seq}", param=param, code="context_length_exceeded")
        job = _EmbeddingJob(token_lists)
        with self._cv:
            if len(self._embed_jobs) >= self.max_waiting:
                self.metrics.add("requests_rejected_total")
                raise RequestRejected(503, f"the server is at capacity ({len(self._embed_jobs)} embedding "
                                      "requests waiting); retry shortly", error_type="server_busy",
                                      code="queue_full", retry_after=2)
            self._embed_jobs.append(job)
            self._cv.notify_all()
        while not job.done.is_set():
            if cancelled():
                job.cancelled.set()  # the loop drops it before its next input
                raise EmbeddingCancelled()
            job.done.wait(EMBED_CANCEL_POLL_S)
        if job.error is not None:
            raise job.error
        return shape(job.vectors), sum(len(t) for t in token_lists)

    def _embed_next(self) -> None:
        """The oldest embedding request's next input (loop thread); a request is done after its last."""
        with self._cv:
            while self._embed_jobs and self._embed_jobs[0].cancelled.is_set():
                self._embed_jobs.popleft()
            if not self._embed_jobs:
                return
            job = self._embed_jobs[0]
        tokens = job.token_lists[len(job.vectors)]
        try:
            vector = self.runner.embed(tokens)
        except Exception as exc:  # this request's failure alone: its caller answers it, the loop goes on
            log.exception("an embedding failed")
            job.error = RequestRejected(500, f"internal error while embedding: {exc}", error_type="server_error")
        else:
            job.vectors.append(vector)
        if job.error is not None or len(job.vectors) == len(job.token_lists):
            with self._cv:
                self._embed_jobs.popleft()
            job.done.set()

    # ---- the loop ------------------------------------------------------------

    def _run(self) -> None:
        if self._warm_up_first:
            try:
                self._warm_result = self.warm_up()
            except BaseException as exc:  # handed to start(), which raises it in the loading thread
                self._warm_result = exc
            finally:
                self._warmed.set()
            if isinstance(self._warm_result, BaseException):
                return
        self._loop()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._active and not self.scheduler.has_work() and not self._embed_jobs:
                    self._cv.wait(timeout=1.0)
                if self._stopping:
                    for job in self._embed_jobs:
                        job.error = RequestRejected(503, "the engine is stopping", error_type="server_busy")
                        job.done.set()
                    return
                self._drop_cancelled_locked()
                self.scheduler.age(time.monotonic(), self._active)
                admitted = self._pop_admissible_locked()
                waiting_rank = self.scheduler.waiting_rank()
                self._publish_queue_locked()
            try:
                for entry in admitted:
                    if isinstance(entry, Parked):
                        self._resume(entry)
                    else:
                        self._admit(entry)
                if waiting_rank is not None:
                    self._park_one_below(waiting_rank)
                # Embeddings and generation share the loop's time equally while both wait: an input is embedded
                # only when the steps since the last one took at least as long as it did.
                if self._embed_jobs and (not self._active or self._steps_owed_s <= 0):
                    started = time.monotonic()
                    self._embed_next()
                    self._steps_owed_s = time.monotonic() - started
                if self._active:
                    started = time.monotonic()
                    self._step()
                    self._steps_owed_s -= time.monotonic() - started
            except Exception:  # a bug here must not wedge every client: fail the batch, keep serving
                log.exception("engine step failed")
                for seq in list(self._active):
                    self._finish(seq, None, error=RequestRejected(500, "internal error while generating",
                                                                  error_type="server_error"))
            with self._cv:
                # Finished sequences left during the step: the gauges must say so even if the loop now idles.
                self._publish_queue_locked()
                self.progress.pending(bool(self._active or self.scheduler.waiting))

    def _pop_admissible_locked(self) -> list:
        """Requests (and parked sequences) that get their slots now: the scheduler's pick, given the governor's
        hint and the slots the prefix cache has free."""
        if not self.scheduler.has_work():
            return []  # the common case mid-generation: no need to stat the governor's file every step
        level = self.throttle.level()
        allowed = sequences_allowed(level, self.model.n_parallel)
        busy = self.model.n_parallel - self.cache.free_slots()
        self.metrics.set_throttle(level, allowed)
        return self.scheduler.pick(min(self.cache.free_slots(), max(0, allowed - busy)), allowed, busy,
                                   self.cache.free_slots(), self._running_prompts(),
                                   lambda r, running: self.cache.worth_waiting(r.prompt_tokens, r.cache_scope,
                                                                               running))

    def _park_one_below(self, rank: int) -> None:
        """A request of class `rank` waits and every slot is busy: park the running single-choice sequence of the
        lowest class below it (the latest to arrive among those), freeing its slot for the next step."""
        if self.cache.free_slots() > 0:
            return
        seq = self.scheduler.preemption_victim(self._active, rank)
        if seq is None:
            return
        state = self.runner.save(seq.seq_id)
        self._active.remove(seq)
        self.cache.release(seq.seq_id, [], cacheable=False)
        self.runner.forget(seq.seq_id)
        with self._cv:
            self.scheduler.park(seq, self._parking.put(state), time.monotonic())
        self.metrics.add("requests_preempted_total")
        self._publish_cache()

    def _resume(self, parked: Parked) -> None:
        """A parked sequence back on a free slot, its cells restored: it goes on from where it stopped."""
        seq, request = parked.seq, parked.request
        slot_id = None
        try:
            state = self._parking.take(parked.state)
            admission = self.cache.admit(None, request.cache_scope)
            slot_id = admission.slot_id
            self._apply(admission)
            if not self.runner.restore(slot_id, state):
                raise RuntimeError("llama.cpp refused the parked sequence's state")
        except Exception:  # this request's alone: it cannot go on, the others do
            log.exception("resuming a parked request failed")
            if slot_id is not None:
                self.cache.release(slot_id, [], cacheable=False)
                self.runner.forget(slot_id)
            seq.sampler.close()
            request.cancel()
            self._settle(request)
            request.sink(Error(RequestRejected(500, "internal error while resuming this request",
                                               error_type="server_error")))
            return
        seq.seq_id = slot_id
        self._active.append(seq)
        if request.parked_at is not None:
            request.parked_s += time.monotonic() - request.parked_at
            request.parked_at = None
        self.metrics.add("requests_resumed_total")
        self._publish_cache()

    def _running_prompts(self) -> list[Running]:
        """The running single-choice sequences' prompts, as far as each has prefilled: what a new request may copy."""
        return [Running(s.seq_id, s.request.prompt_tokens, min(s.n_past, len(s.request.prompt_tokens)),
                        s.request.cache_scope) for s in self._active if s.request.n == 1]

    def _admit(self, request: GenerationRequest) -> None:
        # Only single-choice requests use the cache: n choices would each want the same slot content.
        prompt = request.prompt_tokens if request.n == 1 else None
        taken: list[int] = []
        request.admitted = time.monotonic()
        try:
            for index in range(request.n):
                admission = self.cache.admit(prompt, request.cache_scope,
                                             self._running_prompts() if prompt is not None else ())
                taken.append(admission.slot_id)
                reuse = self._apply(admission)
                if index == 0:
                    request.cached_tokens = reuse
                    request.cache_hit = admission.source if reuse else ""  # wire.Timings.cache_hit
                    request.restored = time.monotonic()
                self._active.append(Sequence(self, request, index, admission.slot_id, n_past=reuse))
        except Exception:
            # A failure here is this request's alone: free what it took, tell its client, keep the batch.
            log.exception("admitting a request failed")
            for seq in [s for s in self._active if s.request is request]:
                self._active.remove(seq)
                seq.sampler.close()
            for slot_id in taken:
                self.cache.release(slot_id, [], cacheable=False)
                self.runner.forget(slot_id)
            request.cancel()
            self._settle(request)
            request.sink(Error(RequestRejected(500, "internal error while starting this request",
                                               error_type="server_error")))
        self._publish_cache()

    def _apply(self, admission: Admission) -> int:
        """Carry out an admission's cache actions; returns the prompt tokens actually reused."""
        reuse = admission.reuse
        for action in admission.actions:
            if isinstance(action, Restore) and not self._restore(action):
                self.cache.restore_failed(action.tier, action.key)
                reuse = 0
            elif isinstance(action, Copy):
                if not self.runner.restore(action.slot_id, self.runner.save(action.source)):
                    log.warning("llama.cpp refused the prefix copied from slot %d; recomputing", action.source)
                    reuse = 0
            elif isinstance(action, Trim):
                self.runner.forget(action.slot_id, action.keep if reuse else 0)
            elif not isinstance(action, (Restore, Copy)):
                self._store_action(action)
        if reuse:
            self.metrics.add("prompt_tokens_cached_total", reuse)
        return reuse

    def _store_action(self, action) -> None:
        if isinstance(action, Spill):
            data = self.runner.save(action.slot_id)
            self.store.put_ram(action.key, data)
            for follow in self.cache.stored_in_ram(action.key, len(data)):
                self._store_action(follow)
        elif isinstance(action, Demote):
            self.store.demote(action.key)
        elif isinstance(action, DropRam):
            self.store.drop_ram(action.key)
        elif isinstance(action, DropDisk):
            self.store.drop_disk(action.key)

    def _restore(self, action: Restore) -> bool:
        data = self.store.ram.get(action.key) if action.tier == "ram" else self.store.read_disk(action.key)
        if data is None:
            return False
        if not self.runner.restore(action.slot_id, data):
            log.warning("llama.cpp refused a cached prefix (%d bytes); recomputing", len(data))
            return False
        return True

    def _publish_cache(self) -> None:
        c = self.cache
        for key in self.store.take_unwritten():  # demoted, never written: not on disk, and its bytes are gone
            c.restore_failed("disk", key)
        self.metrics.set_cache({
            "lookups": c.lookups, "hits": dict(c.hits), "tokens_reused": c.tokens_reused,
            "bytes": {"ram": c.bytes_in("ram"), "disk": c.bytes_in("disk")},
            "entries": {"context": sum(1 for s in c.slots if s.prefix and not s.busy), "ram": len(c.ram),
                        "disk": len(c.disk)},
            "corrupt_files": self.store.corrupt_files})

    def _settle(self, request: GenerationRequest, failed: bool = True) -> None:
        """The request is answered (failed False) or failed or dropped: its key's count goes down and its usage is
        counted, once."""
        with self._cv:
            if self.scheduler.settle(request):
                self.metrics.key_used(request.key, prompt=len(request.prompt_tokens), cached=request.cached_tokens,
                                      generated=request.generated, failed=failed)
                if request.key_tokens_per_minute or request.key_tokens_per_day:  # only limited keys are kept
                    self._ledger.add(request.key, len(request.prompt_tokens) + request.generated, time.time())

    def _drop_cancelled_locked(self) -> None:
        requests, parked_ones = self.scheduler.drop_cancelled()
        for request in requests:
            self._settle(request)
            self.metrics.add("requests_cancelled_total")
        for parked in parked_ones:
            self._parking.drop(parked.state)
            parked.seq.sampler.close()
            self._settle(parked.request)
            self.metrics.add("requests_cancelled_total")
        cancelled = {id(s.request) for s in self._active if s.request.cancelled.is_set()}
        for seq in [s for s in self._active if id(s.request) in cancelled]:
            self._settle(seq.request)
            self._release(seq)
        for _ in cancelled:
            self.metrics.add("requests_cancelled_total")

    def _publish_queue_locked(self) -> None:
        running = len({id(s.request) for s in self._active})
        kv_used = sum(s.n_past for s in self._active)
        self.metrics.set_queue(running, len(self.scheduler.waiting), kv_used,
                               self.model.n_ctx_per_seq * self.model.n_parallel)

    def _release(self, seq: Sequence) -> None:
        if seq not in self._active:
            return
        self._active.remove(seq)
        request = seq.request
        prompt = request.prompt_tokens
        in_kv = prompt[:seq.n_past]
        if self.cache.any_position and seq.n_past > len(prompt):  # and its answer: a chat's next turn quotes it
            in_kv = [*prompt, *seq.sampled[:seq.n_past - len(prompt)]]
        trim = self.cache.release(seq.seq_id, in_kv, cacheable=request.n == 1,
                                  scope=request.cache_scope)
        self.runner.forget(seq.seq_id, trim.keep)
        seq.sampler.close()
        self._publish_cache()

    def _step(self) -> None:
        if self.speculation.enabled:
            self.drafting.draft([s for s in self._active if not s.is_prefilling() and s.next_token is not None])
        decoding = any(not s.is_prefilling() for s in self._active)
        for call in plan_step(self._active, self.prefill_budget.tokens(decoding), self.model.batch_invariant,
                              self.model.row_bounds, self.shape_blind):
            if self.media_from is None:  # a text model: no call is looked through (the loop's hot path)
                self._decode_call(call)
                continue
            text = []
            for part in call:
                if part.tokens[0] >= self.media_from:  # an image alone, encoded and decoded for its own sequence
                    self._decode_images(part)
                else:
                    text.append(part)
            if text:
                self._decode_call(text)

    def _decode_images(self, part) -> None:
        """A prompt chunk that is a run of images' places (step_plan cuts it so): each image through the
        projector, at its place in the sequence."""
        seq = part.seq
        media = seq.request.media
        self.progress.call_started(len(part.tokens))
        pos = part.start_pos
        try:
            while pos < part.start_pos + len(part.tokens):
                chunk = media[pos]
                self.runner.decode_media(seq.seq_id, pos, chunk)
                pos += chunk.n_tokens
        finally:
            elapsed = self.progress.call_ended()
        self.metrics.add("prompt_seconds_total", elapsed)
        self.metrics.add("prompt_tokens_total", len(part.tokens))
        seq.n_past += len(part.tokens)

    def _decode_call(self, call) -> None:
        parts: list[DecodePart] = []
        sample_at: list[tuple[Sequence, int, int]] = []  # (sequence, its first logits row, tokens drafted)
        n_tokens = 0
        for part in call:
            # A decoding sequence's tokens past the first are its draft: each needs its logits to be verified.
            drafted = 0 if part.seq.is_prefilling() else len(part.tokens) - 1
            logits_from = (0 if drafted else len(part.tokens) - 1) if part.wants_logits else None
            parts.append((part.seq.seq_id, part.start_pos, part.tokens, logits_from))
            n_tokens += len(part.tokens)
            if part.wants_logits:
                sample_at.append((part.seq, n_tokens - 1 - drafted, drafted))
        has_prompt = any(p.seq.is_prefilling() for p in call)
        self.progress.call_started(n_tokens)
        failed = None
        try:
            self.runner.decode(parts)
        except RuntimeError as exc:
            failed = exc
        if TEST_DECODE_DELAY_S:
            time.sleep(TEST_DECODE_DELAY_S)
        elapsed = self.progress.call_ended()
        self.metrics.add("n_decode_total")
        self.metrics.add("n_busy_slots_total", len(call))
        if has_prompt:
            self.metrics.add("prompt_seconds_total", elapsed)
            self.prefill_budget.prompt_call_took(n_tokens, elapsed)
        else:  # a decode call's own cost, apart from prompt chunks (bench/serving.py's profile, speculation's price)
            self.metrics.add("predicted_seconds_total", elapsed)
            self.metrics.add("n_decode_generated_total")
            self.metrics.add("n_busy_slots_generated_total", len(call))
            self.drafting.decode_call_took(n_tokens, elapsed)
        if failed is not None:
            raise failed
        for part in call:
            if part.start_pos < len(part.seq.request.prompt_tokens):  # a prompt chunk, not a generated token
                self.metrics.add("prompt_tokens_total", len(part.tokens))
                part.seq.n_past += len(part.tokens)
            else:
                part.seq.n_past += 1  # the pending token; a draft's tokens count as they are accepted
        # Logits are valid only until the next decode call: sample now.
        for seq, index, drafted in sample_at:
            if seq.request.cancelled.is_set():
                continue
            if drafted:
                self._verify(seq, index, drafted)
            else:
                self._sample(seq, index)

    def _verify(self, seq: Sequence, first_index: int, drafted: int) -> None:
        """Sample each drafted position with the sequence's own chain, in order, while the draft agrees: the
        tokens and the chain's state (RNG, penalties, grammar) are those of decoding one token at a time. The
        KV cells past what was kept are removed."""
        draft, seq.draft = seq.draft[:drafted], []
        accepted = 0
        for i in range(drafted + 1):
            token = self._sample(seq, first_index + i)
            if seq not in self._active or i == drafted or token != draft[i]:
                break
            accepted += 1
            seq.n_past += 1
        self.metrics.speculated(self.speculation.kind, drafted, accepted)
        self.drafting.verified(seq, drafted, accepted)
        if seq in self._active:
            self.runner.forget(seq.seq_id, seq.n_past)

    def _sample(self, seq: Sequence, batch_index: int) -> int:
        request = seq.request
        runner = self.runner
        token = runner.sample(seq.sampler, batch_index)
        seq.sampled.append(token)
        if seq.ngrams is not None:
            seq.ngrams.extend((token,))
        elif seq.history is not None:
            seq.history.append(token)
        now = time.monotonic()
        request.generated += 1
        self.metrics.add("tokens_predicted_total")
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.observe_ttft(now - request.arrived)
        if seq.last_token_at is not None:
            self.metrics.observe_token_gap(now - seq.last_token_at)
        seq.last_token_at = now

        if runner.is_end_of_generation(token) and not request.sampling.ignore_eos:
            self._emit_text(seq, seq.output.flush(), None)
            self._finish(seq, "stop")
            return token
        logprob_entry = None
        if request.sampling.top_logprobs is not None:
            logprob_entry = runner.logprobs(batch_index, token, request.sampling.top_logprobs)
        text, hit_stop = seq.output.piece(runner.piece(token))
        self._emit_text(seq, text, logprob_entry)
        if hit_stop:
            self._finish(seq, "stop", stop_string=seq.output.stop_string)
        elif seq.generated >= request.max_tokens or seq.n_past + 1 >= self.model.n_ctx_per_seq:
            self._emit_text(seq, seq.output.flush(), None)
            self._finish(seq, "length")
        else:
            seq.next_token = token
        return token

    def _emit_text(self, seq: Sequence, text: str, logprob_entry: TokenLogprob | None) -> None:
        if text or logprob_entry is not None:
            seq.request.sink(Token(seq.index, text, logprob_entry))

    def _finish(self, seq: Sequence, reason: str | None, error: RequestRejected | None = None,
                stop_string: str | None = None) -> None:
        request = seq.request
        self._release(seq)
        if error is not None:
            self._settle(request)
            if not request.cancelled.is_set():
                request.cancel()
                request.sink(Error(error))
            return
        if rest := seq.output.finish():
            request.sink(Token(seq.index, rest, None))
        request.sink(Finish(seq.index, reason, seq.generated, stop_string))
        request.open_choices -= 1
        if request.open_choices == 0:
            self._settle(request, failed=False)
            request.sink(Done(len(request.prompt_tokens), request.cached_tokens, request.timings(time.monotonic())))
