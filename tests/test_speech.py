"""Whisper models (#58): a random-weight Whisper in whisper.cpp's own format (tests/tiny_whisper.py), added to the
store and loaded on demand into an engine process of its own (whisper.cpp through pywhispercpp; no llama.cpp in
it), answering /v1/audio/transcriptions with its timed segments. With random weights the words are nonsense; what
is proven is that the sound reaches the model (two tones, two transcripts), that each response format carries
whisper.cpp's own segments, that the planner counts what whisper.cpp allocates, and that bad input is a 400 naming
the field."""

from __future__ import annotations

import base64
import re
import subprocess
from pathlib import Path

import numpy as np
import openai
import pytest

from host_runtime.engine.errors import RequestRejected
from host_runtime.placement.whisper_file import WhisperShape, read_shape, resident_bytes
from host_runtime.speech.audio import samples_from_wav
from tests.servers import everycycle, post_json, running_serve
from tests.tiny_gguf import wav, write_tiny_llama
from tests.tiny_whisper import write_whisper


def test_the_header_gives_the_shape_and_the_plan_counts_what_whisper_cpp_allocates(tmp_path):
    path = write_whisper(tmp_path / "test.bin")
    shape = read_shape(path)
    assert (shape.width, shape.heads, shape.audio_layers, shape.text_layers, shape.n_vocab, shape.n_mels) == \
        (64, 2, 1, 1, 51865, 80)
    assert shape.size_name == "unknown" and shape.quantization == "F16"
    assert read_shape(write_tiny_llama(tmp_path / "tiny.gguf")) is None
    (tmp_path / "short.bin").write_bytes(b"lmgg" + bytes(10))
    assert read_shape(tmp_path / "short.bin") is None
    # base's shape: whisper.cpp 1.8.5's load log says KV self 6.29 MB, cross 18.87, pad 3.15, and compute buffers
    # 16.28 + 23.09 + 4.66 + 96.37 MB: 168.7 MB beside the weights
    base = WhisperShape(51865, 1500, 512, 8, 6, 448, 6, 80, 1)
    beside_weights = resident_bytes(base, 0) / 1e6
    assert 165 < beside_weights < 175, beside_weights


def _wav(samples: np.ndarray, rate: int, width: int, channels: int = 1) -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as f:
        f.setnchannels(channels), f.setsampwidth(width), f.setframerate(rate)
        scale = (1 << (8 * width - 1)) - 1
        ints = np.round(np.repeat(samples, channels) * scale).astype(np.int64)
        if width == 1:
            f.writeframes((ints + 128).astype(np.uint8).tobytes())
        elif width == 3:
            f.writeframes(b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints))
        else:
            f.writeframes(ints.astype(f"<i{width}").tobytes())
    return buf.getvalue()


def test_a_wav_becomes_16_khz_mono_floats_whatever_its_rate_width_and_channels():
    t = np.arange(8000) / 8000.0
    tone = (0.5 * np.sin(2 * np.pi * 100 * t)).astype(np.float32)  # 1 s at 8 kHz
    for width in (1, 2, 3, 4):
        got = samples_from_wav(_wav(tone, 8000, width, channels=2))
        assert got.dtype == np.float32 and got.size == 16000  # resampled to 16 kHz, the two channels one
        assert abs(float(got.max()) - 0.5) < 0.02 and abs(float(got.min()) + 0.5) < 0.02, width
    for data, words in ((b"ID3\x04" + bytes(100), "is not a PCM WAV"), (_wav(tone[:0], 16000, 2), "holds no sound")):
        with pytest.raises(RequestRejected) as refused:
            samples_from_wav(data)
        assert refused.value.status == 400 and refused.value.param == "file" and words in refused.value.message


def test_whisper_segments_make_each_timed_format():
    from host_runtime.serving.transcription import parse, render

    segments = [{"start": 0.0, "end": 1.5, "text": "one"}, {"start": 1.5, "end": 2.25, "text": "two"}]
    srt = render(parse({"model": "m", "response_format": "srt"}, wav(2.5, 440.0)), "one two", segments, "en", 2.5)
    assert srt[1] == b"1\n00:00:00,000 --> 00:00:01,500\none\n\n2\n00:00:01,500 --> 00:00:02,250\ntwo\n\n"
    verbose = render(parse({"model": "m", "response_format": "verbose_json"}, wav(2.5, 440.0)), "one two", segments,
                     "de", 2.5)[1]
    assert verbose["language"] == "de" and [s["id"] for s in verbose["segments"]] == [0, 1]


@pytest.fixture(scope="module")
def speech_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("speech")
    store = d / "store"
    added = subprocess.run(everycycle("models", "--store", str(store), "add", "--name", "whisper-test",
                                      str(write_whisper(d / "ggml-test.bin"))), capture_output=True, text=True,
                           timeout=120)
    assert added.returncode == 0, added.stderr
    (d / "run").mkdir()
    with running_serve(["--ctx-size", "256", "--parallel", "1", "--threads", "2", "--model-store", str(store)],
                       d / "run", "serve with a Whisper model in its store") as (base, proc):
        yield base, proc, store


@pytest.mark.system
def test_a_whisper_model_transcribes_in_an_engine_of_its_own(speech_server):
    base, proc, store = speech_server
    assert (store / "whisper-test" / "whisper-test.bin").is_file()  # kept as what it is, not named .gguf
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)

    def transcribe(sound, **kw):
        return client.audio.transcriptions.create(model="whisper-test", file=("tone.wav", sound, "audio/wav"), **kw)

    low, high = transcribe(wav(2.0, 440.0), language="en"), transcribe(wav(2.0, 1760.0), language="en")
    assert low.text and low.text != high.text  # the sound reaches the model
    verbose = transcribe(wav(2.0, 440.0), language="en", response_format="verbose_json")
    assert verbose.text == low.text and verbose.language == "en" and verbose.duration == 2.0
    first = verbose.segments[0]
    assert 0.0 <= first.start < first.end <= 2.0 and first.text == low.text  # whisper.cpp's own times
    srt = transcribe(wav(2.0, 440.0), language="en", response_format="srt")
    assert srt.startswith(f"1\n00:00:00,{round(first.start * 1000):03d} --> 00:00:0{int(first.end)},"), srt
    # whisper.cpp in a process of its own: its engine maps libwhisper and never llama.cpp's library
    pid = int(re.search(r"engine started \(pid (\d+)\) for \S*whisper-test", proc.log()).group(1))
    libraries = Path(f"/proc/{pid}/maps").read_text()
    assert "libwhisper" in libraries and "libllama" not in libraries


@pytest.mark.system
def test_a_whisper_model_refuses_what_it_cannot_do_by_name(speech_server):
    base = speech_server[0]
    status, doc = post_json(base + "/v1/chat/completions", {"model": "whisper-test", "max_tokens": 2,
                                                            "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "speech-to-text model" in doc["error"]["message"], doc
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
    for sound, name, words in ((b"ID3\x04" + bytes(200), "talk.mp3", "Whisper models here take WAV"),
                               (wav(1.0, 440.0), "tone.wav", "'language' must be an ISO 639-1 code")):
        with pytest.raises(openai.BadRequestError) as refused:
            client.audio.transcriptions.create(model="whisper-test", file=(name, sound, "audio/wav"),
                                               language="english" if name == "tone.wav" else openai.NOT_GIVEN)
        assert words in refused.value.message


def test_the_speech_engine_answers_every_other_op_with_a_400(tmp_path):
    """The engine's own refusal, without a server: a Generate to a Whisper model names what it answers."""
    from host_runtime.engine import wire
    from host_runtime.engine.options import EngineOptions
    from host_runtime.speech.service import SpeechService

    service = SpeechService(EngineOptions(model=str(write_whisper(tmp_path / "w.bin"))))
    assert service.info().task == "transcribe" and service.readiness().state == "loading"
    service.load()
    assert service.readiness().ready
    heard = service.transcribe(wire.Transcribe(audio=base64.b64encode(wav(1.0, 440.0)).decode(), language="en"))
    assert heard.duration_s == 1.0 and heard.tokens > 0 and heard.language == "en"
    with pytest.raises(RequestRejected) as refused:
        service.transcribe(wire.Transcribe(audio="@@not base64"))
    assert refused.value.param == "file"
    assert "everycycle_transcriptions_total{model=\"w\"} 1" in service.metrics_text().text


@pytest.mark.system
def test_a_whisper_model_is_pulled_by_its_hub_name_and_a_bin_that_is_no_model_is_refused(tmp_path):
    """hf://OWNER/REPO/ggml-NAME.bin, as whisper.cpp's own repository names its models, through huggingface_hub to
    a loopback Hub: admitted as a Whisper model; a .bin that is neither kind of model is refused, nothing kept."""
    import json

    from tests.file_server import serve_files

    files = tmp_path / "files"
    files.mkdir()
    write_whisper(files / "ggml-test.bin")
    (files / "ggml-notes.bin").write_text("not a model\n" * 100)
    server = serve_files(files)
    env = {"HF_ENDPOINT": server.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_TELEMETRY": "1"}
    store = tmp_path / "store"

    def models(*args):
        import os

        return subprocess.run(everycycle("models", "--store", str(store), *args), capture_output=True, text=True,
                              timeout=120, env={**os.environ, **env})
    try:
        pulled = models("pull", "hf://ggerganov/whisper.cpp/ggml-test.bin")
        assert pulled.returncode == 0, pulled.stderr
        refused = models("pull", "hf://ggerganov/whisper.cpp/ggml-notes.bin")
        assert refused.returncode == 1 and "not a GGUF file" in refused.stderr, refused.stderr
    finally:
        server.shutdown()
    (entry,) = json.loads(models("list", "--json").stdout)
    assert (entry["name"], entry["architecture"], entry["quantization"]) == ("ggml-test", "whisper", "F16")
    assert (store / "ggml-test" / "ggml-test.bin").is_file()
    assert re.search(r"ggml-test .* whisper .* F16 .* speech to text", models("list").stdout)
