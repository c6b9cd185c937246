"""GET /v1/everycycle/capabilities: the box's capability map (host_runtime/fleet/capabilities.py) gathered from
the engine pool's listing, each loaded engine's info, the governor's published state and the update record."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time

from host_runtime.auth.fleet_vouch import VOUCHED_SUFFIX
from host_runtime.engine.client import EngineClient
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.engine.wire import EngineInfo
from host_runtime.fleet.capabilities import (Capabilities, ModelCapability, draining_from_update, governor_view,
                                             update_fields)
from host_runtime.governor.state_file import read_state
from host_runtime.update.system import status


def _model(row, info: EngineInfo | None) -> ModelCapability:
    """row: the pool's PoolModel; info: its engine's answer to `info`, when it has a ready one."""
    if info is None or not info.ready:
        return ModelCapability(row.id, row.state, row.context_length, row.pinned,
                               trained_context_length=row.trained_context_length, room=row.room,
                               size_bytes=row.size_bytes)
    recent = info.recent or {}
    placement = {d["device"]: d["n_layers"] for d in (info.placement or {}).get("devices", [])}
    total = info.n_parallel or 0
    allowed = recent.get("sequences_allowed") or total  # the governor's hint, once the engine has read it
    running = int(recent.get("running") or 0)
    return ModelCapability(
        row.id, "loaded", info.n_ctx or row.context_length, row.pinned, placement,
        slots_total=total, slots_free=max(0, min(total, allowed) - running),
        queue_depth=int(recent.get("waiting") or 0), tokens_per_s=recent.get("tokens_per_s"),
        prefill_tokens_per_s=recent.get("prefill_tokens_per_s"),
        ttft_p50_s=recent.get("ttft_p50_s"), prefix_cache_bytes=dict(recent.get("prefix_cache_bytes") or {}),
        kv_bytes_per_token=(info.placement or {}).get("kv_bytes_per_token"),
        trained_context_length=row.trained_context_length or info.n_ctx_train, shard_hosts=list(info.shards or []),
        size_bytes=row.size_bytes, load_s=info.load_s)


def hardware(infos: list[EngineInfo]) -> dict:
    """This machine's memory and threads, and the devices the loaded models' placements use (each once)."""
    import psutil

    accelerators = {}
    for info in infos:
        for d in (info.placement or {}).get("devices", []):
            accelerators.setdefault(d["device"], {"device": d["device"], "description": d.get("description", ""),
                                                  "memory_bytes": d.get("capacity_bytes")})
    return {"host_memory_bytes": psutil.virtual_memory().total, "cpu_count": os.cpu_count(),
            "accelerators": list(accelerators.values())}


def gather(router, governor_state: str | None) -> Capabilities:
    rows = router.models()
    default_id = router.default_info().model_id
    models, infos = [], []
    for row in rows:
        client = router.default if row.id == default_id else (EngineClient(row.socket) if row.socket else None)
        info = None
        if client is not None:
            try:
                info = client.info(timeout=2.0)
            except EngineUnavailable:
                info = None
        models.append(_model(row, info))
        infos += [info] if info is not None and info.ready else []
    governor = read_state(governor_state)
    system = status(with_entries=False)
    draining, why = draining_from_update(system.get("last_update"))
    return Capabilities(box=socket.gethostname(), version=system["version"],
                        governor=governor_view(governor.doc, governor.fresh, governor.reason), models=tuple(models),
                        draining=draining, draining_reason=why, at_unix=time.time(), hardware=hardware(infos),
                        slot=system["slot"], **update_fields(system.get("last_update")))


class CapabilitiesResource:
    def __init__(self, router, config, verifier=None, ledger=None):
        self._router = router
        self._config = config
        self._verifier = verifier  # the API's KeyVerifier (None: no key file)
        self._ledger = ledger      # the box's key ledger: its vouched keys' use (engine/key_ledger_file.py)

    def on_get(self, req, resp):
        import falcon

        caps = gather(self._router, self._config.governor_state)
        if self._verifier is not None and self._verifier.checks_vouchers():
            use = self._ledger.use_by_key(VOUCHED_SUFFIX, time.time()) if self._ledger is not None else {}
            caps = dataclasses.replace(caps, checks_vouchers=True, use_id=self._config.use_id, vouched_use=use)
        resp.content_type = falcon.MEDIA_JSON
        resp.text = json.dumps(caps.to_wire())
