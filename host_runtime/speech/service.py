"""A Whisper model's engine process (`everycycle engine` given a whisper.cpp model file): loads it with
whisper.cpp through pywhispercpp and answers transcriptions on the engine's socket, in the engine's wire
(engine/wire.py Transcribe -> Transcript), beside Info, Ready and Metrics as every engine answers them.

Why whisper.cpp (bench/speech.py, bench/results-2026-12-06-speech-2core.json: a 2-core EPYC with AVX2, random
weights of the real shapes, 30 s windows, 3 repeats alternated): it is not the faster on this CPU. Its real-time
factor at 100 tokens a window is 0.106 for base and 0.315 for small, faster-whisper's (CTranslate2, float32)
0.068 and 0.191: 1.46-1.57x (spread 1.16-1.81x), the encoder the difference. Both are 3x real time or better for
small. It holds 0.6x the memory (184 against 297 MiB for base, 558 against 942 for small), which on a box that keeps
several models inside one budget is the scarcer thing; it reads the single-file models owners download
(`ggml-small.bin`, quantized Q5/Q8 as the store's other models are) where CTranslate2 needs its own converted
folder (made with torch and transformers); its wheel is 5 MB against CTranslate2's own math libraries; and
whisper.cpp builds for Vulkan (the Radeons the box targets) and CUDA, where CTranslate2's GPU path is CUDA only
(pywhispercpp's wheel is the CPU build: a GPU build is left for later). It runs in a process of its own: its ggml is
not llama.cpp's, and the two never share one.

One whisper.cpp context transcribes one sound at a time (its calls use every thread given); the others wait, up to
MAX_WAITING, then are refused with a 503 that says to retry. A client that leaves aborts its transcription."""

from __future__ import annotations

import base64
import binascii
import logging
import os
import socket
import threading
import time
from pathlib import Path

from host_runtime.common.prometheus_text import exposition
from host_runtime.common.sockets import peer_closed
from host_runtime.engine import wire
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import send_message
from host_runtime.engine.ipc_server import RequestHandler
from host_runtime.engine.model import model_id_for
from host_runtime.engine.options import EngineOptions
from host_runtime.engine.readiness import Verdict
from host_runtime.placement.whisper_file import read_shape, resident_bytes
from host_runtime.speech.audio import WHISPER_RATE, samples_from_wav

log = logging.getLogger("host_runtime.engine.service")
MAX_WAITING = 8  # transcriptions queued behind the running one; past this a request is refused (503, retry)
LANGUAGE_CODES = 2, 3  # ISO 639-1 (whisper.cpp also takes a few three-letter codes: haw, yue)


class SpeechService:
    def __init__(self, options: EngineOptions):
        self.options = options
        self.model_path = options.model
        self.model_id = model_id_for(options.model)
        self.n_threads = options.context.n_threads or os.cpu_count() or 1
        self.state, self.state_reason = "loading", "loading the speech model"
        self.model = None
        self._turn = threading.Lock()
        self._waiting = 0
        self._count_lock = threading.Lock()
        self.served = 0
        self.audio_seconds = 0.0
        self.busy_seconds = 0.0

    def load(self) -> None:
        shape = read_shape(self.model_path)
        if shape is None:
            self.state, self.state_reason = "failed", f"{self.model_path} is not a whisper.cpp model"
            log.error("%s", self.state_reason)
            return
        try:
            from pywhispercpp.model import Model

            started = time.monotonic()
            self.model = Model(str(self.model_path), n_threads=self.n_threads, print_progress=False,
                               print_realtime=False, redirect_whispercpp_logs_to=None)
        except Exception as exc:  # whisper.cpp's own failure (its log says which tensor): the model is unusable
            self.state, self.state_reason = "failed", f"whisper.cpp could not load {self.model_path}: {exc}"
            log.error("%s", self.state_reason)
            return
        self.shape = shape
        self.state, self.state_reason = "ready", "model loaded"
        log.info("loaded %s (Whisper %s, %s) in %.1fs with %d threads; it holds about %.0f MiB", self.model_id,
                 shape.size_name, shape.quantization, time.monotonic() - started, self.n_threads,
                 resident_bytes(shape, os.path.getsize(self.model_path)) / 2**20)

    def save_usage(self) -> None:
        """Nothing kept between runs: a key's transcription tokens are counted by the API (serving/key_tokens)."""

    # ---- ops ---------------------------------------------------------------------------------------------

    def info(self, _request=None) -> wire.EngineInfo:
        return wire.EngineInfo(state=self.state, reason=self.state_reason, model_id=self.model_id,
                               model_path=str(Path(self.model_path).resolve()), pid=os.getpid(),
                               busy=self._turn.locked(), load_progress=1.0 if self.state == "ready" else None,
                               n_parallel=1, max_waiting=MAX_WAITING, task="transcribe")

    def readiness(self, _request=None) -> Verdict:
        if self.state != "ready":
            return Verdict(False, "failed" if self.state == "failed" else "loading", self.state_reason)
        return Verdict(True, "ready", f"ready: a Whisper model; {self.served} transcriptions served")

    def metrics_text(self, _request=None) -> wire.MetricsText:
        """Its counters, written by prometheus_client (common/prometheus_text.py), as every engine's are."""
        from prometheus_client.core import CounterMetricFamily

        def families():
            for name, words, value in (
                    ("everycycle_transcriptions", "Transcriptions answered.", self.served),
                    ("everycycle_transcribed_audio_seconds", "Seconds of sound transcribed.", self.audio_seconds),
                    ("everycycle_transcription_busy_seconds", "Seconds whisper.cpp spent transcribing.",
                     self.busy_seconds)):
                family = CounterMetricFamily(name, words, labels=["model"])
                family.add_metric([self.model_id], value)
                yield family

        return wire.MetricsText(exposition(families))

    def transcribe(self, request: wire.Transcribe, gone=lambda: False) -> wire.Transcript:
        if self.state != "ready":
            raise RequestRejected(503, f"the model is not ready ({self.state_reason})", error_type="server_busy",
                                  code="model_not_ready", retry_after=5)
        if request.language and not (len(request.language) in LANGUAGE_CODES and request.language.isalpha()):
            raise RequestRejected(400, f"'language' must be an ISO 639-1 code such as 'en', got {request.language!r}",
                                  param="language")
        try:
            data = base64.b64decode(request.audio, validate=True)
        except (binascii.Error, ValueError):
            raise RequestRejected(400, "'file' did not arrive as base64", param="file") from None
        samples = samples_from_wav(data)
        with self._count_lock:
            if self._waiting >= MAX_WAITING + 1:
                raise RequestRejected(503, f"{MAX_WAITING} transcriptions are already waiting for this model",
                                      error_type="server_busy", code="queue_full", retry_after=5)
            self._waiting += 1
        try:
            with self._turn:
                if gone():
                    raise RequestRejected(499, "the client left", code="client_gone")
                started = time.monotonic()
                try:
                    segments = self.model.transcribe(
                        samples, language=request.language or "auto", initial_prompt=request.prompt or "",
                        temperature=request.temperature, abort_callback=gone)
                except Exception as exc:  # whisper.cpp's failure, or the abort of a client that left
                    if gone():
                        raise RequestRejected(499, "the client left", code="client_gone") from None
                    raise RequestRejected(500, f"whisper.cpp failed: {exc}", code="transcription_failed") from None
                busy = time.monotonic() - started
                tokens = self._tokens_decoded()
                language = request.language or self._detected_language()
        finally:
            with self._count_lock:
                self._waiting -= 1
        duration = samples.size / WHISPER_RATE
        with self._count_lock:
            self.served += 1
            self.audio_seconds += duration
            self.busy_seconds += busy
        # whisper.cpp's times are centiseconds; a segment never ends past the sound (a poor model's can say so)
        parts = [{"start": min(s.t0 / 100.0, duration), "end": min(s.t1 / 100.0, duration), "text": s.text.strip()}
                 for s in segments]
        log.info("transcribed %.1f s of sound in %.2f s (real-time factor %.3f), %d tokens", duration, busy,
                 busy / duration if duration else 0.0, tokens)
        return wire.Transcript(text=" ".join(p["text"] for p in parts if p["text"]).strip(), segments=parts,
                               language=language, duration_s=round(duration, 3), tokens=tokens)

    def _tokens_decoded(self) -> int:
        import _pywhispercpp as pw

        ctx = self.model._ctx
        return sum(pw.whisper_full_n_tokens(ctx, i) for i in range(pw.whisper_full_n_segments(ctx)))

    def _detected_language(self) -> str:
        import _pywhispercpp as pw

        try:
            return pw.whisper_lang_str(pw.whisper_full_lang_id(self.model._ctx))
        except Exception:  # an older binding without the call: say so rather than guess
            return "unknown"


class SpeechHandler(RequestHandler):
    service: SpeechService

    def answer(self, sock: socket.socket, request) -> None:
        service = self.service
        answer = {wire.Info: service.info, wire.Ready: service.readiness, wire.Metrics: service.metrics_text,
                  wire.Transcribe: lambda r: service.transcribe(r, lambda: peer_closed(sock))}.get(type(request))
        try:
            if answer is None:
                raise RequestRejected(400, f"the model '{service.model_id}' is a speech-to-text model: it answers "
                                           "/v1/audio/transcriptions only", code="unsupported_for_model",
                                      param="model")
            reply = answer(request)
        except RequestRejected as exc:
            if exc.status == 499:
                return
            reply = wire.Error(exc)
        send_message(sock, wire.event_to_wire(reply))
