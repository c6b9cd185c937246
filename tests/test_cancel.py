"""A client that goes away mid-stream stops its generation and frees its sequence."""

from __future__ import annotations

import time

import pytest

from tests.conftest import MODEL_ID
from tests.servers import http_get, metric_value, wait_for

pytestmark = pytest.mark.system  # every test here starts processes or loads the model


def metric(server: str, name: str) -> float:
    return metric_value(http_get(server + "/metrics")[1].decode(), name)


def test_disconnect_mid_stream_cancels_the_generation(server, client):
    cancelled_before = metric(server, "everycycle_requests_cancelled_total")
    predicted_before = metric(server, "everycycle_tokens_predicted_total")
    # Counting at temperature 0 goes on far past the few chunks read here.
    stream = client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4, 5, 6, 7, 8,", max_tokens=1500,
                                       temperature=0, stream=True)
    received = 0
    last = None
    for _chunk in stream:
        received += 1
        last = _chunk
        if received == 5:
            break
    assert received == 5 and last.choices[0].finish_reason is None
    assert metric(server, "everycycle_requests_processing") == 1
    stream.close()
    wait_for(lambda: metric(server, "everycycle_requests_processing") == 0, 10, "the request to leave the batch")
    assert metric(server, "everycycle_requests_cancelled_total") == cancelled_before + 1
    # It stopped: far fewer than the 1500 tokens it asked for were generated, and no more come.
    generated = metric(server, "everycycle_tokens_predicted_total") - predicted_before
    assert generated < 1500
    time.sleep(0.5)
    assert metric(server, "everycycle_tokens_predicted_total") - predicted_before == generated


def test_disconnect_during_a_non_streaming_request_cancels_it(server, api_key):
    """Nobody reads the answer of a non-streaming request whose client left: the engine stops generating it."""
    import json
    import socket
    from urllib.parse import urlsplit

    cancelled_before = metric(server, "everycycle_requests_cancelled_total")
    predicted_before = metric(server, "everycycle_tokens_predicted_total")
    body = json.dumps({"model": MODEL_ID, "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 1500,
                       "temperature": 0}).encode()
    url = urlsplit(server)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {api_key[1]}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    wait_for(lambda: metric(server, "everycycle_tokens_predicted_total") - predicted_before > 20, 30,
             "the generation to start")
    sock.close()
    wait_for(lambda: metric(server, "everycycle_requests_processing") == 0, 10, "the request to leave the batch")
    assert metric(server, "everycycle_requests_cancelled_total") == cancelled_before + 1
    generated = metric(server, "everycycle_tokens_predicted_total") - predicted_before
    assert generated < 1500
