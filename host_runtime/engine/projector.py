"""A model's projector (llama-server's --mmproj) through libmtmd: the image encoder beside the text model. A
prompt with images is tokenized here into text tokens and, for each image, a run of placeholder tokens: ids past
the vocabulary, made from the image's hash (libmtmd's id of its pixels), one per place the image takes. Everything
keyed on tokens then keys on the image itself: the prefix cache finds a repeated image and never a different image
with as many places (LMCache/LMCache#690 was that bug), and the step plan cuts before and after a run, never inside
(step_plan.next_cut). The runner decodes a run through here: encoded and decoded in one libmtmd call for its
sequence alone, so a request's answer does not depend on what else is batched."""

from __future__ import annotations

import ctypes
import hashlib
from dataclasses import dataclass

from host_runtime.common.errors import EveryCycleError
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.media import MAX_IMAGE_PIXELS, audio_format, image_format, image_size, placeholder_tokens
from host_runtime.engine.wire import MEDIA_MARKER

MEDIA_CHUNK_TEXT = 0  # mtmd_input_chunk_type: 0 text, 1 image, 2 audio


class ProjectorError(EveryCycleError, RuntimeError):
    """A projector libmtmd cannot load for this model, or one this engine cannot serve."""


@dataclass
class MediaChunk:
    """One image of one request, tokenized: libmtmd's chunk (its preprocessed pixels), freed with this object."""
    pointer: object
    n_tokens: int
    media_id: str
    free: object = None  # libmtmd's mtmd_input_chunk_free, kept so that freeing needs no import at exit

    def __del__(self) -> None:
        if self.pointer and self.free is not None:
            self.free(self.pointer)
            self.pointer = None


@dataclass(frozen=True)
class MediaPrompt:
    tokens: list[int]
    media: dict[int, MediaChunk]  # the prompt position each image starts at -> its chunk


class Projector:
    def __init__(self, path: str, model, n_threads: int):
        """path: the projector's GGUF; model: engine.model.LoadedModel, the text model it projects into."""
        from llama_cpp import mtmd_cpp

        self._mtmd = mtmd_cpp
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = model.placement.n_gpu_layers > 0
        params.n_threads = max(1, n_threads)
        params.print_timings = False
        self._ctx = mtmd_cpp.mtmd_init_from_file(path.encode(), model.model.model, params)
        if not self._ctx:
            raise ProjectorError(f"libmtmd could not load the projector {path} for this model (its log says why: "
                                 "a projector made for another model's width, or not a projector)")
        if mtmd_cpp.mtmd_decode_use_mrope(self._ctx):
            # M-RoPE (Qwen2-VL's family) gives an image's places positions apart from their count, which the
            # engine's one-position-per-token bookkeeping does not hold yet.
            self.close()
            raise ProjectorError(f"{path}: a projector whose model places images by M-RoPE (Qwen2-VL's family) "
                                 "is not served yet")
        self.path = path
        self.marker = mtmd_cpp.mtmd_default_marker().decode()
        if self.marker != MEDIA_MARKER:  # the API writes wire's marker where each image goes
            self.close()
            raise ProjectorError(f"libmtmd marks an image {self.marker!r}, not {MEDIA_MARKER!r} as the API writes")
        self.vision = bool(mtmd_cpp.mtmd_support_vision(self._ctx))
        self.audio = bool(mtmd_cpp.mtmd_support_audio(self._ctx))
        self._n_vocab = model.n_vocab
        self._add_bos = model.add_bos()

    def close(self) -> None:
        if self._ctx:
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None

    def tokenize(self, prompt: str, media: list[bytes], param: str = "messages") -> MediaPrompt:
        """The rendered prompt, whose markers (one per image or sound, in order) stand where each goes, as text
        tokens and placeholder runs. RequestRejected (400) for bytes that are neither an image nor a sound this
        projector reads, or that libmtmd cannot decode."""
        m = self._mtmd
        if prompt.count(self.marker) != len(media):
            raise RequestRejected(400, f"the messages hold {prompt.count(self.marker)} media markers "
                                  f"({self.marker!r}) for {len(media)} images or sounds: text may not contain the "
                                  "marker", param=param)
        bitmaps = []
        try:
            for i, data in enumerate(media):
                what = self._check(data, i + 1, param)
                buffer = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
                bitmap = m.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(data), False)
                if not bitmap:
                    raise RequestRejected(400, f"{what} could not be decoded (a damaged file?)", param=param,
                                          code="invalid_image" if what.startswith("image") else "invalid_audio")
                # Our own id, the bytes' hash, for sounds as for images: the placeholders, and so the prefix
                # cache, key on it
                m.mtmd_bitmap_set_id(bitmap, hashlib.sha256(data).hexdigest().encode())
                bitmaps.append(bitmap)
            return self._chunks(prompt, bitmaps, param)
        finally:
            for bitmap in bitmaps:
                m.mtmd_bitmap_free(bitmap)

    def _check(self, data: bytes, n: int, param: str) -> str:
        """An image this projector sees or a sound it hears, by the bytes' signature and an image's header (a
        decompression bomb refused unread); the words naming it ("image 2 of the request")."""
        if audio_format(data) is not None:
            if not self.audio:
                raise RequestRejected(400, f"sound {n} of the request: this model's projector takes images, not "
                                      "audio", param=param, code="model_not_multimodal")
            return f"sound {n} of the request"
        if image_format(data) is None:
            raise RequestRejected(400, f"item {n} of the request is neither a PNG, JPEG, GIF or BMP image nor a WAV, "
                                  "MP3 or FLAC sound", param=param, code="invalid_image")
        if not self.vision:
            raise RequestRejected(400, f"image {n} of the request: this model's projector takes audio, not images",
                                  param=param, code="model_not_multimodal")
        size = image_size(data)
        if size is None or size[0] * size[1] > MAX_IMAGE_PIXELS:
            said = "gives no size in its header" if size is None else f"is {size[0]}x{size[1]} pixels"
            raise RequestRejected(400, f"image {n} of the request {said} (at most {MAX_IMAGE_PIXELS:,} pixels)",
                                  param=param, code="invalid_image")
        return f"image {n} of the request"

    def _chunks(self, prompt: str, bitmaps: list, param: str) -> MediaPrompt:
        m = self._mtmd
        text = prompt.encode()
        given = m.mtmd_input_text(text, len(text), self._add_bos, True)
        chunks = m.mtmd_input_chunks_init()
        try:
            array = (m.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
            rc = m.mtmd_tokenize(self._ctx, chunks, ctypes.byref(given), array, len(bitmaps))
            if rc != 0:
                raise RequestRejected(400, f"libmtmd could not tokenize the prompt with its images (code {rc})",
                                      param=param)
            tokens: list[int] = []
            media: dict[int, MediaChunk] = {}
            seen: dict[str, int] = {}
            for i in range(m.mtmd_input_chunks_size(chunks)):
                chunk = m.mtmd_input_chunks_get(chunks, i)
                kind = m.mtmd_input_chunk_get_type(chunk)
                if kind == MEDIA_CHUNK_TEXT:
                    n = ctypes.c_size_t(0)
                    pointer = m.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    tokens.extend(pointer[j] for j in range(n.value))
                    continue
                n_tokens = m.mtmd_input_chunk_get_n_tokens(chunk)
                # A sound longer than the encoder's window (30 s for Whisper's) comes as several chunks of one id
                media_id = (m.mtmd_input_chunk_get_id(chunk) or b"").decode()
                seen[media_id] = seen.get(media_id, -1) + 1
                media_id = f"{media_id}/{seen[media_id]}"
                media[len(tokens)] = MediaChunk(m.mtmd_input_chunk_copy(chunk), n_tokens, media_id,
                                                m.mtmd_input_chunk_free)
                tokens.extend(placeholder_tokens(media_id, n_tokens, self._n_vocab))
            return MediaPrompt(tokens, media)
        finally:
            m.mtmd_input_chunks_free(chunks)

    def decode(self, lctx, chunk: MediaChunk, n_past: int, seq_id: int, n_batch: int) -> None:
        """The image encoded and its embeddings decoded into the sequence at n_past (libmtmd switches the
        attention to non-causal around it where the model wants that, as gemma3 does)."""
        new_n_past = ctypes.c_int32(0)
        rc = self._mtmd.mtmd_helper_eval_chunk_single(self._ctx, lctx, chunk.pointer, n_past, seq_id, n_batch,
                                                      False, ctypes.byref(new_n_past))
        if rc != 0:
            raise ProjectorError(f"libmtmd could not encode or decode an image (code {rc})")
        if new_n_past.value != n_past + chunk.n_tokens:
            raise ProjectorError(f"an image took positions {n_past}..{new_n_past.value}, not its "
                                 f"{chunk.n_tokens} places")
