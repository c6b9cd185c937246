"""Audio in (#58): a random-weight text model with an ultravox projector (a Whisper encoder) that libmtmd really
loads and runs, served by the batched engine. What is proven is that the sound reaches the model: two tones give
different greedy answers, the same sound again the same answer from the prefix cache, and bad audio is a 400
naming the field."""

from __future__ import annotations

import base64
import json
import urllib.request

import openai
import pytest

from host_runtime.engine.media import audio_format
from tests.servers import Proc, everycycle, free_port, ready, wait_for
from tests.tiny_gguf import png, wav, write_audio_pair

A440, A880 = wav(1.0, 440.0), wav(1.0, 880.0)


def test_a_sounds_format_is_read_from_its_signature():
    assert [audio_format(x) for x in (A440, b"fLaC....", b"ID3\x04...", b"\xff\xfb\x90", b"RIFF\x00\x00\x00\x00AVI ",
                                      png(2, 2, (0, 0, 0)))] == ["wav", "flac", "mp3", "mp3", None, None]


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("audio")
    model, projector = write_audio_pair(d)
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--model", str(model), "--mmproj", str(projector),
                           "--threads", "2", "--workers", "1", "--parallel", "2", "--ctx-size", "1024",
                           "--run-dir", str(d)), d / "serve.log")
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(base), 90, "the tiny audio server", proc)
        yield base
    finally:
        proc.stop()


def _hear(client, sound: bytes, text: str = "What do you hear?"):
    return client.chat.completions.create(model="tiny-hearing", max_tokens=8, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": text}, {"type": "input_audio", "input_audio": {
            "data": base64.b64encode(sound).decode(), "format": "wav"}}]}])


@pytest.mark.system
def test_a_sound_reaches_the_model_and_a_repeated_one_comes_from_the_prefix_cache(audio_server):
    client = openai.OpenAI(base_url=audio_server + "/v1", api_key="unused", max_retries=0, timeout=120)
    low = _hear(client, A440)
    assert low.choices[0].message.content != _hear(client, A880).choices[0].message.content
    assert low.usage.prompt_tokens > 100  # a 30 s window's 100 places, counted as prompt tokens
    again = _hear(client, A440)
    assert again.choices[0].message.content == low.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens >= 100


def _post(base: str, doc: dict) -> tuple[int, dict]:
    req = urllib.request.Request(base + "/v1/chat/completions", json.dumps(doc).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.system
def test_bad_audio_and_an_image_for_an_audio_projector_are_400s(audio_server):
    def with_part(part):
        return {"model": "tiny-hearing", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "hear"}, part]}]}

    field = "messages[0].content[1].input_audio"
    for audio, words, param in (({"data": base64.b64encode(b"not a sound").decode(), "format": "wav"},
                                 "is not a WAV, MP3 or FLAC sound", field + ".data"),
                                ({"data": "@@@@", "format": "wav"}, "is not valid base64", field + ".data"),
                                ("just text", "must be", field)):
        status, doc = _post(audio_server, with_part({"type": "input_audio", "input_audio": audio}))
        assert status == 400 and doc["error"]["param"] == param and words in doc["error"]["message"], doc
    image = "data:image/png;base64," + base64.b64encode(png(64, 64, (1, 2, 3))).decode()
    status, doc = _post(audio_server, with_part({"type": "image_url", "image_url": {"url": image}}))
    assert status == 400 and doc["error"]["code"] == "model_not_multimodal" and "not images" in doc["error"]["message"]
