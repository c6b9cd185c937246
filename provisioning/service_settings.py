"""box.toml as each service's typed settings, by the file provisioning writes: what apply writes and what
validate checks first (each service's own type judges its fields; errors name the box.toml field)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agent_bmc.settings import from_box as bmc_from_box
from host_runtime.common.setting_rules import SettingsError, from_table
from host_runtime.fleet.settings import BOX_SHARD_HOLDER_KEYS, OWN_API
from host_runtime.fleet.settings import from_box as fleet_from_box
from host_runtime.front.settings import from_box as front_from_box
from host_runtime.governor.settings import from_box as governor_from_box
from host_runtime.models.store import Store
from host_runtime.serving.settings import ServingSettings

MODELS_DIR = "var/lib/everycycle/models"
USAGE_DIR = "var/lib/everycycle/usage"  # per-key usage, kept across restarts and updates (the data partition)


def service_settings(box: dict) -> dict:
    """box.toml as each service's typed settings, by the file provisioning writes. Raises SettingsError naming
    the box.toml field; validation calls it first."""
    model = box["model"]
    path = f"/{MODELS_DIR}/{Path(model['path']).name}" if model["source"] == "bundle" and model.get("path") else ""
    if model["source"] == "store" and model.get("name"):
        path = str(Store(Path("/") / MODELS_DIR).file_for(model["name"]))
    try:
        pull = {"pull_url": model.get("url", ""), "pull_sha256": model.get("sha256", ""),
                "pull_name": model.get("name", "")} if model["source"] == "pull" else {}
        serving = ServingSettings(model=path, context_length=int(model.get("context_length") or 0),
                                  quantization=model.get("quantization", ""), usage_dir=f"/{USAGE_DIR}",
                                  prefix_cache_shared=box.get("api", {}).get("prefix_cache") == "shared", **pull)
    except SettingsError as exc:
        raise SettingsError(f"model.{exc.field}", exc.message) from None
    serving = _serving_table(box.get("serving", {}), serving, model)
    serving = _tracing_table(box.get("tracing", {}), serving)
    fleet = fleet_from_box(box)
    if hosts := box.get("fleet", {}).get("shard_hosts"):
        try:  # the keys to them: apply writes the file (plan_files)
            serving = dataclasses.replace(serving, shard_hosts=tuple(hosts), shard_key_file=BOX_SHARD_HOLDER_KEYS)
        except SettingsError as exc:
            raise SettingsError(f"fleet.{exc.field}", exc.message) from None
    if fleet.role == "gateway":
        serving = dataclasses.replace(serving, fleet_listen=OWN_API, fleet_router=f"127.0.0.1:{fleet.router_port}")
        # apply writes the fleet key's signing seed into this gateway's key file (plan_files): it vouches
        fleet = dataclasses.replace(fleet, vouch_for_clients=True)
    return {"etc/everycycle/front.toml": front_from_box(box), "etc/everycycle/governor.toml": governor_from_box(box),
            "etc/everycycle/serving.toml": serving, "etc/everycycle/bmc.toml": bmc_from_box(box),
            "etc/everycycle/fleet.toml": fleet}


def _serving_table(table: dict, serving, model: dict):
    """box.toml's [serving] onto the settings [model] gave; errors name the box.toml field."""
    if "context_length" in table and "context_length" in model:
        raise SettingsError("serving.context_length", "is also given as model.context_length: give it once")
    return from_table(ServingSettings, table, "serving", onto=serving)


def _tracing_table(table: dict, serving):
    """box.toml's [tracing] onto the serving settings (the API sends the spans); errors name the box.toml field."""
    names = {"endpoint": "trace_endpoint", "sample_ratio": "trace_sample_ratio"}
    values = {names[k]: (float(v) if k == "sample_ratio" and not isinstance(v, bool) else v)
              for k, v in table.items() if k in names}
    try:
        return dataclasses.replace(serving, **values)
    except SettingsError as exc:
        field = next((k for k, v in names.items() if v == exc.field), exc.field)
        raise SettingsError(f"tracing.{field}", exc.message) from None
