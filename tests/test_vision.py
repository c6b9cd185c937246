"""Images (#58): a random-weight text model with a gemma3 projector that libmtmd really loads and runs, served by
the batched engine. With random weights the answers are nonsense; what is proven is that the image reaches the
model: two images give different greedy answers, the same image twice the same answer from the prefix cache, an
image alone the answer it gets batched beside others; and bad media is a 400 naming the field."""

from __future__ import annotations

import base64
import concurrent.futures
import json

import openai
import pytest

from host_runtime.engine.media import image_format, placeholder_tokens
from tests.conftest import MODEL_ID
from tests.servers import Proc, everycycle, free_port, post_json, ready, running_serve, wait_for
from tests.tiny_gguf import png, wav, write_vision_pair

RED, BLUE, GREEN = png(64, 64, (220, 20, 20)), png(64, 64, (20, 20, 220)), png(64, 64, (20, 200, 20))
STRIPES = png(64, 64, lambda x, y: (255, 255, 255) if (x // 8) % 2 else (0, 0, 0))


def test_an_images_places_are_its_own_token_ids_past_the_vocabulary():
    a = placeholder_tokens("image-a", 16, 49152)
    assert a == placeholder_tokens("image-a", 16, 49152) and min(a) >= 49152 and max(a) < 2**31 - 1
    assert not set(a) & set(placeholder_tokens("image-b", 16, 49152))  # another image shares no place
    assert [image_format(x) for x in (RED, b"\xff\xd8\xff\xe0rest", b"GIF89a..", b"BM..", b"RIFF....WEBP")] == \
        ["png", "jpeg", "gif", "bmp", None]


def test_an_images_size_is_read_from_its_header_and_a_decompression_bomb_is_refused_before_decoding():
    import struct

    from host_runtime.engine.media import image_size
    from host_runtime.serving.errors import APIError
    from host_runtime.serving.protocol import image_payload

    gif = b"GIF89a" + struct.pack("<HH", 300, 200) + bytes(10)
    bmp = b"BM" + bytes(16) + struct.pack("<ii", 640, -480) + bytes(10)  # a negative height: stored top-down
    jpeg = (b"\xff\xd8\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
            + b"\xff\xc0" + struct.pack(">HBHH", 17, 8, 1080, 1920) + bytes(10))
    assert [image_size(x) for x in (png(64, 32, (1, 2, 3)), gif, bmp, jpeg, b"\xff\xd8\xff\xe0")] == \
        [(64, 32), (300, 200), (640, 480), (1920, 1080), None]
    # A PNG whose header says 20,000 x 20,000: a few bytes that would unpack to 1.2 GB
    bomb = png(1, 1, (0, 0, 0)).replace(struct.pack(">II", 1, 1), struct.pack(">II", 20000, 20000), 1)
    assert image_size(bomb) == (20000, 20000)
    with pytest.raises(APIError) as refused:
        image_payload(base64.b64encode(bomb).decode(), "messages[0].content[1].image_url")
    assert refused.value.status == 400 and "20000x20000 pixels" in refused.value.message
    assert image_payload(base64.b64encode(RED).decode(), "x") == base64.b64encode(RED).decode()


def _serve(d, *extra: str):
    model, projector = write_vision_pair(d)
    return running_serve(
        ["--model", str(model), "--mmproj", str(projector), "--threads", "2", "--workers", "1", "--parallel", "3",
         "--ctx-size", "512", *extra], d, "the tiny vision server")


@pytest.fixture(scope="module")
def vision_server(tmp_path_factory):
    with _serve(tmp_path_factory.mktemp("vision")) as (base, _):
        yield base


@pytest.fixture
def uncached_vision_server(tmp_path):
    """Without a prefix cache: a repeated prompt is computed again, not read back."""
    with _serve(tmp_path, "--no-prefix-cache") as (base, _):
        yield base


def _data_uri(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def _ask(client, image: bytes | None, text: str = "What is in this picture?", model: str = "tiny-vision", **kw):
    content = [{"type": "text", "text": text}]
    if image is not None:
        content.append({"type": "image_url", "image_url": {"url": _data_uri(image)}})
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}],
                                          max_tokens=8, temperature=0, **kw)


@pytest.mark.system
def test_an_image_reaches_the_model_and_a_repeated_one_comes_from_the_prefix_cache(vision_server):
    client = openai.OpenAI(base_url=vision_server + "/v1", api_key="unused", max_retries=0, timeout=120)
    red = _ask(client, RED)
    answers = {red.choices[0].message.content, _ask(client, BLUE).choices[0].message.content,
               _ask(client, STRIPES).choices[0].message.content}
    assert len(answers) == 3  # each image changes the greedy answer: the pixels reach the model
    assert red.usage.prompt_tokens > 16  # the image's 16 places count as prompt tokens (a key's usage too)
    again = _ask(client, RED)
    assert again.choices[0].message.content == red.choices[0].message.content
    # The prompt's text and the image's places came from the cache: all but the tail after the image
    assert again.usage.prompt_tokens_details.cached_tokens >= 16
    # A new image with as many places at the same position is never taken for one cached (#58, LMCache#690):
    # only the text before it is reused
    green = _ask(client, GREEN)
    assert green.usage.prompt_tokens == red.usage.prompt_tokens
    assert green.usage.prompt_tokens_details.cached_tokens <= again.usage.prompt_tokens_details.cached_tokens - 16


@pytest.mark.system
def test_an_image_alone_gets_the_answer_it_gets_batched_beside_text_users(uncached_vision_server):
    client = openai.OpenAI(base_url=uncached_vision_server + "/v1", api_key="unused", max_retries=0, timeout=120)
    alone = _ask(client, STRIPES, text="Describe it.").choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        texts = [pool.submit(_ask, client, None, f"Tell me a story number {i}.") for i in range(2)]
        batched = pool.submit(_ask, client, STRIPES, text="Describe it.")
        assert batched.result().choices[0].message.content == alone
        assert all(t.result().choices[0].message.content for t in texts)


def _post(base: str, doc: dict) -> tuple[int, dict]:
    return post_json(base + "/v1/chat/completions", doc)


@pytest.mark.system
def test_bad_media_is_a_400_that_names_the_field(vision_server):
    def with_url(url):
        return {"model": "tiny-vision", "max_tokens": 4, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]}]}

    field = "messages[0].content[1].image_url"
    for url, words in (("data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
                        "is not a PNG, JPEG, GIF or BMP image"),
                       ("data:image/png;base64,@@@@", "is not valid base64"),
                       ("https://example.com/cat.png", "remote image URLs are not fetched"),
                       ("data:image/png,rawbytes", "must be a base64 data: URI")):
        status, doc = _post(vision_server, with_url(url))
        assert status == 400 and doc["error"]["param"] == field and words in doc["error"]["message"], doc
    # the marker typed as text is not taken for an image
    status, doc = _post(vision_server, {"model": "tiny-vision", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "<__media__>"},
                                     {"type": "image_url", "image_url": {"url": _data_uri(RED)}}]}]})
    assert status == 400 and "markers" in doc["error"]["message"], doc
    # a sound for a projector that sees only
    status, doc = _post(vision_server, {"model": "tiny-vision", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "input_audio", "input_audio": {
            "data": base64.b64encode(wav(0.5, 440.0)).decode(), "format": "wav"}}]}]})
    assert status == 400 and doc["error"]["code"] == "model_not_multimodal" and "not audio" in doc["error"]["message"]


@pytest.mark.system
def test_a_model_served_without_a_projector_says_so(client):
    with pytest.raises(openai.BadRequestError) as refused:
        _ask(client, RED, model=MODEL_ID)
    assert refused.value.code == "model_not_multimodal" and "--mmproj" in refused.value.message


@pytest.mark.system
def test_every_apis_official_client_sends_its_own_image_shape(vision_server):
    """The Messages API's base64 image block, the Responses API's input_image, Ollama's images: each reaches the
    model (two images, two answers), and a Messages request laid out as a chat completion's gets its answer."""
    import anthropic
    import ollama

    chat = openai.OpenAI(base_url=vision_server + "/v1", api_key="unused", max_retries=0, timeout=120)
    claude = anthropic.Anthropic(base_url=vision_server, api_key="unused", max_retries=0, timeout=120)
    local = ollama.Client(host=vision_server, timeout=120)

    def by_anthropic(image):
        blocks = [{"type": "text", "text": "What is in this picture?"},
                  {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                               "data": base64.b64encode(image).decode()}}]
        answer = claude.messages.create(model="tiny-vision", max_tokens=8, extra_body={"temperature": 0},
                                        messages=[{"role": "user", "content": blocks}])
        return answer.content[0].text

    def by_responses(image):
        answer = chat.responses.create(model="tiny-vision", max_output_tokens=8, temperature=0, input=[
            {"role": "user", "content": [{"type": "input_text", "text": "What is in this picture?"},
                                         {"type": "input_image", "image_url": _data_uri(image)}]}])
        return answer.output_text

    def by_ollama(image):
        answer = local.chat(model="tiny-vision", options={"temperature": 0, "num_predict": 8},
                            messages=[{"role": "user", "content": "What is in this picture?", "images": [image]}])
        return answer.message.content

    # Open WebUI offers an image upload where Ollama's /api/show says vision
    assert "vision" in local.show("tiny-vision").capabilities
    for ask in (by_anthropic, by_responses, by_ollama):
        assert ask(RED) != ask(BLUE), ask.__name__
    expected = _ask(chat, RED).choices[0].message.content
    assert by_anthropic(RED) == by_responses(RED) == expected  # the same prompt, the same greedy answer
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model="tiny-vision", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])
    assert "remote image URLs are not fetched" in str(refused.value)
    with pytest.raises(ollama.ResponseError) as refused:
        local.chat(model="tiny-vision", messages=[{"role": "user", "content": "see", "images": [b"plain text"]}])
    assert refused.value.status_code == 400 and "messages[0].images[0]" in str(refused.value)
    # An image's signature but no image behind it: the engine's decoder says so, still a 400
    with pytest.raises(ollama.ResponseError) as refused:
        local.chat(model="tiny-vision", messages=[{"role": "user", "content": "see",
                                                   "images": [b"GIF89a\x04\x00\x04\x00-broken-after-the-header"]}])
    assert refused.value.status_code == 400 and "could not be decoded" in str(refused.value)


@pytest.mark.system
def test_a_store_model_added_with_its_projector_reads_images_wherever_it_is_loaded(tmp_path):
    """`models add FILE --mmproj PROJECTOR`: the projector kept beside the model, and an engine that loads it on
    demand (the server starts with the built-in model) loads its projector too. A projector that is not one is
    refused before anything is copied."""
    import subprocess

    text, projector = write_vision_pair(tmp_path / "files")
    store = tmp_path / "store"

    def models(*argv):
        return subprocess.run(everycycle("models", "--store", str(store), *argv), capture_output=True, text=True,
                              timeout=120)

    refused = models("add", str(text), "--name", "seeing", "--mmproj", str(text))
    assert refused.returncode == 1 and "not a projector" in refused.stderr and "Traceback" not in refused.stderr
    assert not (store / "seeing").exists()  # nothing half-added
    added = models("add", str(text), "--name", "seeing", "--mmproj", str(projector), "--json")
    assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["projector"] == "mmproj.gguf" and (store / "seeing" / "mmproj.gguf").is_file()
    port = free_port()
    proc = Proc(everycycle("serve", "--port", str(port), "--model-store", str(store), "--threads", "2",
                           "--workers", "1", "--parallel", "2", "--ctx-size", "512", "--run-dir", str(tmp_path)),
                tmp_path / "serve.log")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: ready(base), 90, "the server", proc)
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=120)
        assert _ask(client, RED, model="seeing").choices[0].message.content != \
            _ask(client, BLUE, model="seeing").choices[0].message.content
        import ollama

        shown = ollama.Client(host=base, timeout=60)
        assert "vision" in shown.show("seeing").capabilities  # from the store's manifest
        assert "vision" not in shown.show(MODEL_ID).capabilities
    finally:
        proc.stop()


@pytest.mark.system
def test_an_image_larger_than_the_text_limit_is_taken_and_text_past_it_is_not(vision_server):
    """A generation's body may be up to 32 MiB with its images; all but the images' base64 keeps the 1 MiB limit."""
    import random

    noise = random.Random(7).randbytes(640 * 640 * 3)
    big = png(640, 640, lambda x, y: noise[(y * 640 + x) * 3:(y * 640 + x) * 3 + 3])  # noise: zlib cannot shrink it
    assert len(big) > 1 << 20
    status, doc = _post(vision_server, {"model": "tiny-vision", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": _data_uri(big)}}]}]})
    assert status == 200 and doc["usage"]["prompt_tokens"] > 16, doc
    status, doc = _post(vision_server, {"model": "tiny-vision", "max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "x" * (1 << 20)}, {"type": "image_url", "image_url": {"url": _data_uri(RED)}}]}]})
    assert status == 413 and "besides its images" in doc["error"]["message"], doc


@pytest.mark.system
def test_plan_counts_the_projector_on_the_device_libmtmd_runs_it_on(tmp_path):
    """`plan --mmproj`: the projector's weights (its tensors' bytes) and its encoder's compute for one image at its
    size (64x64 in 8x8 patches: 64 positions, 32 wide, 2 heads) on the CPU, where a model with no GPU layers has
    it; a text model given as the projector is refused naming the flag."""
    import subprocess

    from host_runtime.placement import gguf_c

    model, projector = write_vision_pair(tmp_path)
    done = subprocess.run(everycycle("plan", "--model", str(model), "--mmproj", str(projector), "--placement", "cpu",
                                     "--json", "--ctx-size", "256", "--parallel", "1"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)["projector"]
    with gguf_c.GGUFTable(projector) as table:
        weights = sum(size for _, _, _, size in table.tensors())
    assert shown == {"weights_bytes": weights, "compute_bytes": 64 * 32 * 4 * 12 + 64 ** 2 * 2 * 4,
                     "takes": "vision", "positions": 64, "device": "CPU"}
    table_text = subprocess.run(everycycle("plan", "--model", str(model), "--mmproj", str(projector), "--placement",
                                           "cpu", "--ctx-size", "256", "--parallel", "1"),
                                capture_output=True, text=True, timeout=120).stdout
    assert "projector (vision) on CPU:" in table_text
    refused = subprocess.run(everycycle("plan", "--model", str(model), "--mmproj", str(model)), capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and "--mmproj" in refused.stderr and "not a projector" in refused.stderr
