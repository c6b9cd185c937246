"""A client that goes away mid-stream stops its generation and frees its sequence."""

from __future__ import annotations

import time

from tests.conftest import MODEL_ID
from tests.servers import http_get, wait_for


def metric(server: str, name: str) -> float:
    text = http_get(server + "/metrics")[1].decode()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


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
