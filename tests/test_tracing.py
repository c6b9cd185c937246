"""Request tracing, for real: `everycycle serve --trace-endpoint` sends its spans with OpenTelemetry's OTLP exporter
to a collector in this process (tests/otlp_receiver.py); the official OpenAI client sends a W3C traceparent and
reads the answer's traceresponse. The fleet's gateway passing one trace to a member is in test_fleet_gateway."""

from __future__ import annotations

import os
import secrets
import subprocess

import openai
import pytest

from tests.otlp_receiver import OTLPReceiver
from tests.servers import everycycle, running_serve

pytestmark = pytest.mark.system
MODEL = "SmolLM2-135M-Instruct.Q4_1"
MODEL_SPAN = "POST /v1/chat/completions"
PHASES = {"queue", "prefill", "decode", "stream"}
SLACK_NS = 5_000_000  # the engine's phases are measured on its clock from when the worker sent the request


@pytest.fixture(scope="module")
def traced(tmp_path_factory, api_key):
    receiver = OTLPReceiver()
    try:
        with running_serve(["--keys", api_key[0], "--threads", "1", "--workers", "1", "--ctx-size", "1024",
                            "--parallel", "2", "--trace-endpoint", f"http://127.0.0.1:{receiver.port}"],
                           tmp_path_factory.mktemp("traced"), "the traced server",
                           env={**os.environ, "OTEL_BSP_SCHEDULE_DELAY": "200"}) as (base, proc):  # sent in 0.2 s
            yield base, receiver, proc
    finally:
        receiver.close()


def _client(base: str, key: str, traceparent: str | None = None) -> openai.OpenAI:
    headers = {"traceparent": traceparent} if traceparent else None
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=60, default_headers=headers)


def _traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def _ask(client: openai.OpenAI, text: str, **kw):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0, **kw)
    return raw.headers.get("traceresponse"), raw.parse()


def test_a_request_joins_the_clients_trace_with_the_engines_phases_as_its_children(traced, api_key):
    base, receiver, _ = traced
    traceparent, trace_id, client_span = _traceparent()
    header, answer = _ask(_client(base, api_key[1], traceparent), "Name a colour.")
    assert header.startswith(f"00-{trace_id}-") and header.endswith("-01")
    spans = {s.name: s for s in receiver.wait_for_trace(trace_id, {MODEL_SPAN} | PHASES)}
    request = spans[MODEL_SPAN]
    assert request.parent_id == client_span and request.span_id == header.split("-")[2]
    assert request.service == "everycycle" and request.status != 2
    a = request.attributes
    assert a["everycycle.key"] == "tests" and a["everycycle.model"] == answer.model
    assert a["everycycle.prompt_tokens"] == answer.usage.prompt_tokens
    assert a["everycycle.completion_tokens"] == answer.usage.completion_tokens
    assert a["http.response.status_code"] == 200 and a["everycycle.preemptions"] == 0
    for name in PHASES:
        assert spans[name].parent_id == request.span_id and spans[name].trace_id == trace_id, name
    # The engine's phases end to end, inside the request's span
    queue, prefill, decode = spans["queue"], spans["prefill"], spans["decode"]
    assert request.start_ns <= queue.start_ns and queue.end_ns <= prefill.start_ns + 1
    assert prefill.end_ns <= decode.start_ns + 1 and decode.end_ns <= request.end_ns + SLACK_NS
    assert decode.attributes["everycycle.completion_tokens"] == answer.usage.completion_tokens


def test_a_streamed_repeat_is_a_cache_hit_and_its_spans_end_with_the_stream(traced, api_key):
    base, receiver, _ = traced
    client = _client(base, api_key[1])
    text = "Say something about the sea, briefly, in one sentence."
    _ask(client, text)
    traceparent, trace_id, _ = _traceparent()
    with _client(base, api_key[1], traceparent).chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=8, temperature=0,
            stream=True) as response:
        assert response.headers["traceresponse"].split("-")[1] == trace_id
        chunks = list(response.iter_lines())
    assert any("[DONE]" in c for c in chunks)
    spans = {s.name: s for s in receiver.wait_for_trace(trace_id, {MODEL_SPAN, "prefix_cache.restore"} | PHASES)}
    request = spans[MODEL_SPAN]
    assert request.attributes["everycycle.cache_hit"] == "context"
    assert request.attributes["everycycle.cached_tokens"] > 0
    # the request and its stream end when the last chunk is written, after the engine's last token
    assert spans["stream"].end_ns >= spans["decode"].end_ns - SLACK_NS and request.end_ns >= spans["stream"].end_ns


def test_without_a_traceparent_a_request_starts_its_own_trace(traced, api_key):
    base, receiver, _ = traced
    header, _ = _ask(_client(base, api_key[1]), "Hello.")
    _, trace_id, span_id, flags = header.split("-")
    spans = receiver.wait_for_trace(trace_id, {MODEL_SPAN})
    request = next(s for s in spans if s.name == MODEL_SPAN)
    assert request.parent_id == "" and request.span_id == span_id and int(flags, 16) & 1  # sampled


def test_a_client_without_a_valid_key_makes_no_span(traced, api_key):
    """#56, item 13: tracing began before the key check, so any client made spans with trace ids it chose."""
    base, receiver, _ = traced
    refused, refused_id, _ = _traceparent()
    with pytest.raises(openai.AuthenticationError) as err:
        _ask(_client(base, "not-a-key", refused), "Hello.")
    assert "traceresponse" not in err.value.response.headers
    header, _ = _ask(_client(base, api_key[1]), "Hello.")  # sent after it: its spans come after the refusal's would
    receiver.wait_for_trace(header.split("-")[1], {MODEL_SPAN})
    assert receiver.trace(refused_id) == []


def test_a_clients_sampled_flag_no_longer_forces_a_span():
    """The sample ratio decides on the trace id, for a client's traceparent too (it followed a sampled flag)."""
    import falcon.testing

    from host_runtime.serving.tracing import RequestTrace, Tracing

    tracing = Tracing("http://127.0.0.1:9/", sample_ratio=1e-9)
    kept = 0
    for _ in range(20):
        traceparent, _, _ = _traceparent()
        req = falcon.testing.create_req(path="/v1/chat/completions", method="POST",
                                        headers={"traceparent": traceparent})
        trace = RequestTrace(tracing, req)
        kept += trace.span.get_span_context().trace_flags.sampled
        assert trace.trace_id == traceparent.split("-")[1]  # still joined to the client's trace
    assert kept == 0


@pytest.mark.parametrize("endpoint, words", [("collector:4318", "must be an OTLP/HTTP collector's"),
                                             ("http://otel.example.com:4318", "a collector beyond this LAN must be reached over https")])
def test_a_trace_endpoint_that_is_not_an_otlp_url_is_refused_naming_the_option(tmp_path, endpoint, words):
    out = subprocess.run(everycycle("serve", "--trace-endpoint", endpoint, "--run-dir", str(tmp_path)),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and f"--trace-endpoint: {words}" in out.stderr
    assert "Traceback" not in out.stderr
