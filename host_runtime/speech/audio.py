"""A WAV file as the 16 kHz mono samples Whisper takes (pure, numpy): PCM of 8, 16, 24 or 32 bits, any rate, any
channel count (averaged), resampled linearly. Anything else is refused naming the file field: the box decodes WAV
for Whisper itself rather than shell out to ffmpeg for MP3 or FLAC."""

from __future__ import annotations

import io
import wave

import numpy as np

from host_runtime.engine.errors import RequestRejected

WHISPER_RATE = 16000
MAX_SECONDS = 2 * 3600  # a sound longer than two hours is refused before decoding (it would take ~1 GiB as floats)


def bad_audio(message: str) -> RequestRejected:
    return RequestRejected(400, message, code="invalid_audio", param="file")


def samples_from_wav(data: bytes) -> np.ndarray:
    """The sound as float32 samples at 16 kHz, mono, in [-1, 1]."""
    try:
        with wave.open(io.BytesIO(data)) as f:
            channels, width, rate, frames = f.getnchannels(), f.getsampwidth(), f.getframerate(), f.getnframes()
            if rate <= 0 or channels <= 0:
                raise bad_audio("'file' is a WAV with no sample rate or channels")
            if frames / rate > MAX_SECONDS:
                raise bad_audio(f"'file' is {frames / rate:.0f} s long; a sound may be at most {MAX_SECONDS} s")
            raw = f.readframes(frames)
    except (wave.Error, EOFError) as exc:
        raise bad_audio(f"'file' is not a PCM WAV this box can read ({exc}); Whisper models here take WAV "
                        "(16-bit PCM at 16 kHz is what they use)") from None
    if width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0
    elif width == 3:
        b = np.frombuffer(raw[: len(raw) // 3 * 3], dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        value = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        samples = (np.where(value >= 1 << 23, value - (1 << 24), value) / float(1 << 23)).astype(np.float32)
    elif width == 4:
        samples = np.frombuffer(raw, dtype="<i4").astype(np.float32) / float(1 << 31)
    else:
        raise bad_audio(f"'file' has {width * 8}-bit samples; a WAV here has 8, 16, 24 or 32")
    samples = samples[: len(samples) // channels * channels].reshape(-1, channels).mean(axis=1)
    if samples.size == 0:
        raise bad_audio("'file' holds no sound (a WAV of no frames)")
    if rate != WHISPER_RATE:
        at = np.arange(int(samples.size * WHISPER_RATE / rate)) * (rate / WHISPER_RATE)
        samples = np.interp(at, np.arange(samples.size), samples).astype(np.float32)
    return np.ascontiguousarray(samples, dtype=np.float32)
