"""OpenAI's /v1/audio/transcriptions (pure), answered by a chat model whose projector takes audio, as llama-server
answers it: the form's fields checked, the sound asked to be written down word for word in a chat request, and the
answer shaped into the response format asked for (json, text, srt, vtt, verbose_json). An LLM gives no timestamps:
srt, vtt and verbose_json carry one segment spanning the sound (its length read from a WAV's header)."""

from __future__ import annotations

import base64
import io
import wave
from dataclasses import dataclass

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
    if response_format in TIMED_FORMATS and duration is None:
        raise bad(f"'response_format' {response_format} needs the sound's length, which this box reads from a WAV "
                  f"only (this is {kind.upper()}): send a WAV, or ask for json or text", "response_format")
    return Transcription(fields["model"], audio, fields.get("language") or None, fields.get("prompt") or None,
                         response_format, temperature, duration)


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


def render(ask: Transcription, text: str) -> tuple[str, bytes | dict]:
    """(content type, body): a JSON document (dict) or text, by the format asked for."""
    if ask.response_format == "json":
        return "application/json", {"text": text}
    if ask.response_format == "text":
        return "text/plain; charset=utf-8", (text + "\n").encode()
    end = ask.duration_s or 0.0
    if ask.response_format == "srt":
        return "text/plain; charset=utf-8", f"1\n{_clock(0, ',')} --> {_clock(end, ',')}\n{text}\n\n".encode()
    if ask.response_format == "vtt":
        return "text/vtt; charset=utf-8", f"WEBVTT\n\n{_clock(0, '.')} --> {_clock(end, '.')}\n{text}\n\n".encode()
    return "application/json", {"task": "transcribe", "language": ask.language or "unknown", "duration": end,
                                "text": text, "segments": [{"id": 0, "start": 0.0, "end": end, "text": text}]}
