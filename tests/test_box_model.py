"""box.toml's model: the JSON Schema is generated from it, and each field a service takes is judged by the
service's own rule (the same type object), so provisioning and the service cannot disagree."""

from __future__ import annotations

import typing

import pytest

from host_runtime.common.setting_rules import SettingsError
from host_runtime.fleet.settings import FleetSettings
from host_runtime.front.settings import FrontSettings
from host_runtime.governor.settings import GovernorSettings
from host_runtime.measure.requirement import Requirement
from host_runtime.serving.settings import ServingSettings
from provisioning import box_model
from tests.test_provisioning import BASE, _with

# (box.toml table, its field) -> (the service's settings class, the field it becomes)
SHARED = {
    ("Serving", "context_length"): (ServingSettings, "context_length"),
    ("Model", "context_length"): (ServingSettings, "context_length"),
    ("Serving", "parallel"): (ServingSettings, "parallel"),
    ("Serving", "kv_budget_mib"): (ServingSettings, "kv_budget_mib"),
    ("Serving", "models_memory_mib"): (ServingSettings, "models_memory_mib"),
    ("Serving", "speculation"): (ServingSettings, "speculation"),
    ("Serving", "cache_type_k"): (ServingSettings, "cache_type_k"),
    ("Serving", "cache_type_v"): (ServingSettings, "cache_type_v"),
    ("Tracing", "sample_ratio"): (ServingSettings, "trace_sample_ratio"),
    ("Api", "port"): (FrontSettings, "https_port"),
    ("Api", "http_port"): (FrontSettings, "http_port"),
    ("Api", "metrics"): (FrontSettings, "metrics"),
    ("Power", "target_c"): (GovernorSettings, "target_c"),
    ("Power", "ceiling_c"): (GovernorSettings, "ceiling_c"),
    ("Power", "safe_fraction"): (GovernorSettings, "safe_fraction"),
    ("Power", "mode"): (GovernorSettings, "mode"),
    ("Fleet", "role"): (FleetSettings, "role"),
    ("Fleet", "policy"): (FleetSettings, "policy"),
    ("Fleet", "mdns"): (FleetSettings, "mdns"),
    ("Fleet", "vrrp_priority"): (FleetSettings, "vrrp_priority"),
    ("Fleet", "vrrp_router_id"): (FleetSettings, "vrrp_router_id"),
    **{("Requirement", name): (Requirement, name) for name in ("ttft_p50_s", "time_per_token_s", "concurrent_users",
                                                                "prompt_tokens", "answer_tokens")},
}


def _hint(cls, name):
    return typing.get_type_hints(cls, include_extras=True)[name]


def test_the_schema_file_is_the_one_the_model_generates():
    assert box_model.SCHEMA_FILE.read_text() == box_model.schema_text(), \
        "box_schema.json is stale: run .venv/bin/python -m provisioning.box_model --write"


@pytest.mark.parametrize("box_field,service_field", SHARED.items(), ids=[".".join(k) for k in SHARED])
def test_a_box_field_a_service_takes_has_the_services_rule(box_field, service_field):
    table, name = box_field
    assert _hint(getattr(box_model, table), name) is _hint(*service_field)


@pytest.mark.parametrize("box_field,service_field,value", [
    (("power", "target_c"), (GovernorSettings, "target_c"), 20.0),
    (("serving", "parallel"), (ServingSettings, "parallel"), 257),
    (("serving", "cache_type_v"), (ServingSettings, "cache_type_v"), "q9_0"),
    (("fleet", "vrrp_priority"), (FleetSettings, "vrrp_priority"), 255),
    (("requirement", "concurrent_users"), (Requirement, "concurrent_users"), 0),
])
def test_a_value_one_refuses_the_other_refuses_in_the_same_words(box_field, service_field, value):
    assert box_model.errors(BASE) == []
    table, name = box_field
    refused = dict(box_model.errors({**BASE, table: {**BASE.get(table, {}), name: value}}))
    with pytest.raises(SettingsError) as service:
        service_field[0](**{service_field[1]: value})
    assert refused[".".join(box_field)] == service.value.message


def test_errors_name_the_field_and_say_the_rule():
    assert box_model.errors(_with("api.port", "8443")) == [("api.port", "must be a whole number, got str")]
    assert box_model.errors(_with("colour", "blue")) == [("(top level)", "unknown setting 'colour'")]
    assert box_model.errors(_with("hostname", None)) == [("hostname", "is required")]
    assert box_model.errors(_with("network.interfaces", [])) == [("network.interfaces", "must not be empty")]
    # a text too short is said as a list too short is (pydantic names it string_too_short)
    assert box_model.errors(_with("api.generate_keys", [""])) == [("api.generate_keys[0]", "must not be empty")]
    assert box_model.errors(_with("serving", {"keep_alive": [5]})) == [
        ("serving.keep_alive", "must be a string or a number, got list")]
    (field, words), = box_model.errors(_with("model", {"source": "pull", "name": "../etc"}))
    assert field == "model.name" and words.startswith("'../etc' is not a model name")
    assert box_model.errors(BASE) == []

