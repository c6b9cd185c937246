"""The request models (serving/request_models.py): a body's first broken rule is the API's 400 naming the field,
in the API's words; null is "not given"; unknown fields pass (clients send many)."""

from __future__ import annotations

import pytest

from host_runtime.serving import request_models as rm
from host_runtime.serving.errors import APIError

MSGS = [{"role": "user", "content": "hi"}]


def _refusal(model, body) -> tuple[str | None, str, str]:
    with pytest.raises(APIError) as err:
        rm.check(model, body)
    return err.value.param, err.value.message, err.value.code


@pytest.mark.parametrize("body,param,message,code", [
    ({"model": "m"}, "messages", "'messages' is required", "missing_required_parameter"),
    ({"model": "m", "messages": []}, "messages", "'messages' must not be empty", "invalid_value"),
    ({"model": "m", "messages": MSGS, "temperature": 7}, "temperature", "'temperature' must be between 0 and 2, got 7",
     "invalid_value"),
    ({"model": "m", "messages": MSGS, "top_p": 0}, "top_p", "'top_p' must be above 0 and at most 1, got 0",
     "invalid_value"),
    ({"model": "m", "messages": MSGS, "max_tokens": True}, "max_tokens", "'max_tokens' must be an integer, got bool",
     "invalid_type"),
    ({"model": "m", "messages": MSGS, "max_tokens": "10"}, "max_tokens", "'max_tokens' must be an integer, got str",
     "invalid_type"),
    # a union: a value of no member's kind is told the kinds; of a member's kind, the error inside that member
    ({"model": "m", "messages": MSGS, "stop": 3}, "stop", "'stop' must be a string or an array, got int",
     "invalid_type"),
    ({"model": "m", "messages": MSGS, "stop": ["a", 5]}, "stop[1]", "'stop[1]' must be a string, got int",
     "invalid_type"),
    ({"model": "m", "messages": MSGS, "stop": list("abcde")}, "stop", "'stop' must have at most 4 items",
     "invalid_value"),
    # a nested object without a field it needs names the object
    ({"model": "m", "messages": MSGS, "tools": [{"type": "function"}]}, "tools[0]", "'tools[0]' needs 'function'",
     "missing_required_parameter"),
    ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", None, "invalid_value"),
    # a table's keys are data: an error in one names the table
    ({"model": "m", "messages": MSGS, "logit_bias": {"\u00b2": 1}}, "logit_bias",
     "'logit_bias' must be keyed by token ids, got '\u00b2'", "invalid_value"),
    ({"model": "m", "messages": MSGS, "logit_bias": {"5": 500}}, "logit_bias",
     "'logit_bias' must be between -100 and 100, got 500", "invalid_value"),
])
def test_a_chat_body_is_refused_naming_the_field(body, param, message, code):
    got_param, got_message, got_code = _refusal(rm.ChatRequest, body)
    assert (got_param, got_code) == (param, code)
    if message is not None:
        assert got_message == message


def test_null_is_not_given_and_unknown_fields_pass():
    body = {"model": "m", "messages": MSGS, "temperature": None, "seed": None, "user": "someone", "store": False}
    checked = rm.check(rm.ChatRequest, body)
    assert checked.temperature is None and checked.model_extra["user"] == "someone"  # the parse reads the model


def test_what_the_protocol_modules_decide_passes_the_model():
    """Rules that need more than one field or the served model stay with the protocol modules: the model lets
    them through (an image part, a hosted tool, a legacy prompt list, an empty prompt with a suffix)."""
    rm.check(rm.ChatRequest, {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "x"}}]}]})
    rm.check(rm.ResponsesRequest, {"model": "m", "input": "x", "tools": [{"type": "web_search"}]})
    rm.check(rm.CompletionRequest, {"model": "m", "prompt": ["a", "b"]})
    rm.check(rm.CompletionRequest, {"model": "m", "prompt": "", "suffix": "x"})


def test_messages_needs_max_tokens_and_count_tokens_does_not():
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert _refusal(rm.MessagesRequest, body)[:1] == ("max_tokens",)
    rm.check(rm.CountTokensRequest, body)
