"""Audio in (#58): a random-weight text model with an ultravox projector (a Whisper encoder) that libmtmd really
loads and runs, served by the batched engine. What is proven is that the sound reaches the model: two tones give
different greedy answers, the same sound again the same answer from the prefix cache, and bad audio is a 400
naming the field."""

from __future__ import annotations

import base64
import urllib.request

import openai
import pytest

from host_runtime.engine.media import audio_format
from tests.servers import post_json, running_serve
from tests.tiny_gguf import png, wav, write_audio_pair

A440, A880 = wav(1.0, 440.0), wav(1.0, 880.0)


def test_a_sounds_format_is_read_from_its_signature():
    assert [audio_format(x) for x in (A440, b"fLaC....", b"ID3\x04...", b"\xff\xfb\x90", b"RIFF\x00\x00\x00\x00AVI ",
                                      png(2, 2, (0, 0, 0)))] == ["wav", "flac", "mp3", "mp3", None, None]


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory):
    d = tmp_path_factory.mktemp("audio")
    model, projector = write_audio_pair(d)
    with running_serve(
            ["--model", str(model), "--mmproj", str(projector), "--threads", "2", "--workers", "1", "--parallel", "2",
             "--ctx-size", "1024"], d, "the tiny audio server") as (base, _):
        yield base


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
    return post_json(base + "/v1/chat/completions", doc)


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


def test_a_transcriptions_form_is_checked_field_by_field_and_each_format_rendered():
    from host_runtime.serving.errors import APIError
    from host_runtime.serving.transcription import check_timed_format, parse, render

    ask = parse({"model": "m", "response_format": "srt", "language": "en"}, wav(2.5, 440.0))
    assert ask.duration_s == 2.5
    assert render(ask, "hello there") == ("text/plain; charset=utf-8",
                                          b"1\n00:00:00,000 --> 00:00:02,500\nhello there\n\n")
    vtt = parse({"model": "m", "response_format": "vtt"}, wav(61.25, 440.0, rate=8000))
    assert render(vtt, "hi")[1] == b"WEBVTT\n\n00:00:00.000 --> 00:01:01.250\nhi\n\n"
    verbose = render(parse({"model": "m", "response_format": "verbose_json"}, A440), "hi")[1]
    assert verbose["duration"] == 1.0 and verbose["segments"] == [{"id": 0, "start": 0.0, "end": 1.0, "text": "hi"}]
    assert render(parse({"model": "m"}, A440), "hi") == ("application/json", {"text": "hi"})
    for fields, audio, param in (({"model": "m"}, None, "file"), ({}, A440, "model"),
                                 ({"model": "m"}, b"plain text", "file"),
                                 ({"model": "m", "response_format": "docx"}, A440, "response_format"),
                                 ({"model": "m", "temperature": "hot"}, A440, "temperature"),
                                 ({"model": "m", "temperature": "3"}, A440, "temperature")):
        with pytest.raises(APIError) as refused:
            parse(fields, audio)
        assert refused.value.status == 400 and refused.value.param == param, (fields, refused.value.message)
    with pytest.raises(APIError) as untimed:  # a chat model's answer has no timestamps, and a FLAC no read length
        check_timed_format(parse({"model": "m", "response_format": "srt"}, b"fLaC" + bytes(40)))
    assert untimed.value.param == "response_format"


@pytest.mark.system
def test_transcriptions_through_the_official_client_in_every_format(audio_server):
    client = openai.OpenAI(base_url=audio_server + "/v1", api_key="unused", max_retries=0, timeout=120)

    def transcribe(sound, **kw):
        return client.audio.transcriptions.create(model="tiny-hearing", file=("tone.wav", sound, "audio/wav"), **kw)

    low, high = transcribe(A440), transcribe(A880)
    assert low.text and low.text != high.text  # the sound reaches the model
    assert transcribe(A440, response_format="text").strip() == low.text
    srt = transcribe(A440, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:01,000\n") and low.text in srt
    assert transcribe(A440, response_format="vtt").startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.000\n")
    verbose = transcribe(A440, response_format="verbose_json", language="en")
    assert verbose.duration == 1.0 and verbose.language == "en"
    with pytest.raises(openai.BadRequestError) as refused:
        client.audio.transcriptions.create(model="tiny-hearing", file=("notes.txt", b"not a sound", "text/plain"))
    assert "'file' is not a WAV, MP3 or FLAC sound" in refused.value.message
    req = urllib.request.Request(audio_server + "/v1/audio/transcriptions", b'{"model": "tiny-hearing"}',
                                 {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused_json:
        urllib.request.urlopen(req, timeout=30)
    assert refused_json.value.code == 400 and b"multipart/form-data" in refused_json.value.read()
