"""OpenAI's /v1/audio/transcriptions (pure): the form's fields checked, the request a Whisper model's engine
answers (engine/wire.py Transcribe: its timed segments), or, for a chat model whose projector takes audio (as
llama-server answers it), the sound asked to be written down word for word in a chat request; the answer shaped
into the response format asked for (json, text, srt, vtt, verbose_json). An LLM gives no timestamps: there srt,
vtt and verbose_json carry one segment spanning the sound (its length read from a WAV's header)."""

from __future__ import annotations

import base64
import io
import wave
from dataclasses import dataclass

from host_runtime.engine import wire
from host_runtime.engine.media import audio_format
from host_runtime.serving.protocol import bad

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
TIMED_FORMATS = ("srt", "vtt", "verbose_json")
MAX_AUDIO_BYTES = 20 << 20  # one sound, as a chat request's input_audio takes
INSTRUCTION = "Transcribe the audio word for word. Answer with the transcript alone."


@dataclass(frozen=True)
class Transcription:
    model: str
    audio: bytes
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    duration_s: float | None  # a WAV's length; None for MP3 or FLAC


def parse(fields: dict[str, str], audio: bytes | None) -> Transcription:
    """The form's fields (text) and its file, checked; 400s name the field."""
    if audio is None:
        raise bad("'file' is required: the sound, as a multipart file (WAV, MP3 or FLAC)", "file",
                  "missing_required_parameter")
    if not fields.get("model"):
        raise bad("'model' is required", "model", "missing_required_parameter")
    if len(audio) > MAX_AUDIO_BYTES:
        raise bad(f"'file' is {len(audio)} bytes; a sound may be at most {MAX_AUDIO_BYTES >> 20} MiB", "file",
                  "audio_too_large")
    kind = audio_format(audio)
    if kind is None:
        raise bad("'file' is not a WAV, MP3 or FLAC sound", "file", "invalid_audio")
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise bad(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}, got {response_format!r}",
                  "response_format")
    try:
        temperature = float(fields.get("temperature") or 0.0)
    except ValueError:
        raise bad(f"'temperature' must be a number, got {fields['temperature']!r}", "temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise bad(f"'temperature' must be between 0 and 1, got {temperature:g}", "temperature")
    duration = wav_duration(audio) if kind == "wav" else None
    return Transcription(fields["model"], audio, fields.get("language") or None, fields.get("prompt") or None,
                         response_format, temperature, duration)


def check_timed_format(ask: Transcription) -> None:
    """A chat model's answer has no timestamps: srt, vtt and verbose_json need the sound's length instead."""
    if ask.response_format in TIMED_FORMATS and ask.duration_s is None:
        raise bad(f"'response_format' {ask.response_format} needs the sound's length, which this box reads from a "
                  f"WAV only (this is {audio_format(ask.audio).upper()}): send a WAV, or ask for json or text",
                  "response_format")


def engine_request(ask: Transcription) -> wire.Transcribe:
    """What a Whisper model's engine is asked."""
    return wire.Transcribe(audio=base64.b64encode(ask.audio).decode(), language=ask.language, prompt=ask.prompt,
                           temperature=ask.temperature)


def engine_timeout_s(ask: Transcription) -> float:
    """How long a Whisper transcription may take: generous beside small's real-time factor on 2 cores (~0.5),
    with room for the ones queued ahead of it (a sound's length unknown where it is not a WAV: the engine
    refuses those at once)."""
    return 600.0 + 3.0 * (ask.duration_s or 0.0)


def wav_duration(data: bytes) -> float | None:
    try:
        with wave.open(io.BytesIO(data)) as f:
            return f.getnframes() / f.getframerate()
    except (wave.Error, EOFError, ZeroDivisionError):
        return None


def chat_body(ask: Transcription) -> dict:
    """The chat completion that writes the sound down."""
    words = INSTRUCTION
    if ask.language:
        words += f" The speech is in {ask.language}."
    if ask.prompt:
        words += f" Earlier words, or its vocabulary: {ask.prompt}"
    return {"model": ask.model, "temperature": ask.temperature, "max_tokens": 1024, "messages": [
        {"role": "user", "content": [{"type": "text", "text": words}, {"type": "input_audio", "input_audio": {
            "data": base64.b64encode(ask.audio).decode(), "format": audio_format(ask.audio)}}]}]}


def _clock(seconds: float, separator: str) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 3_600_000:02d}:{ms // 60_000 % 60:02d}:{ms // 1000 % 60:02d}{separator}{ms % 1000:03d}"


def render(ask: Transcription, text: str, segments: list[dict] | None = None, language: str | None = None,
           duration_s: float | None = None) -> tuple[str, bytes | dict]:
    """(content type, body): a JSON document (dict) or text, by the format asked for. `segments` ({"start", "end",
    "text"}, seconds): a Whisper model's; without them one segment spans the sound."""
    if ask.response_format == "json":
        return "application/json", {"text": text}
    if ask.response_format == "text":
        return "text/plain; charset=utf-8", (text + "\n").encode()
    end = duration_s if duration_s is not None else (ask.duration_s or 0.0)
    timed = segments if segments is not None else [{"start": 0.0, "end": end, "text": text}]
    if ask.response_format == "srt":
        return "text/plain; charset=utf-8", "".join(
            f"{i}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n{s['text']}\n\n"
            for i, s in enumerate(timed, 1)).encode()
    if ask.response_format == "vtt":
        return "text/vtt; charset=utf-8", ("WEBVTT\n\n" + "".join(
            f"{_clock(s['start'], '.')} --> {_clock(s['end'], '.')}\n{s['text']}\n\n" for s in timed)).encode()
    return "application/json", {"task": "transcribe", "language": language or ask.language or "unknown",
                                "duration": end, "text": text,
                                "segments": [{"id": i, "start": s["start"], "end": s["end"], "text": s["text"]}
                                             for i, s in enumerate(timed)]}
