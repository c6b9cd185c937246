"""What an owner does to the store's models beyond the store itself: make one the model serving starts with, or
remove one the serving service may have loaded. One implementation for the CLI (`everycycle models default|rm`)
and the console's models screen; each returns what it did in words and raises StoreError saying why not."""

from __future__ import annotations

from pathlib import Path

from host_runtime.common import settings_file
from host_runtime.common.run_layout import run_dir, supervisor_socket
from host_runtime.common.settings_file import SettingsError
from host_runtime.common.supervisor_rpc import restart_service
from host_runtime.engine.errors import RequestRejected
from host_runtime.engine.ipc import EngineUnavailable
from host_runtime.models.errors import StoreError
from host_runtime.models.store import Store
from host_runtime.pool.protocol import PoolClient
from host_runtime.serving.settings import ServingSettings




def set_default(store: Store, name: str | None, settings_path: Path, *, restart: bool = True,
                runs: Path | None = None, say=lambda line: None) -> str:
    """serving.toml's model (None: the image's built-in one), changed in place (atomically; every other setting
    kept), then the serving service restarted through supervisord where one runs."""
    try:
        settings = settings_file.load(ServingSettings, settings_path)
    except SettingsError as exc:
        raise StoreError(f"{settings_path}: {exc}") from None
    if settings.pull_url and name is not None and name != settings.pulled_name and \
            settings.pulled_name not in {m.name for m in store.list()}:
        raise StoreError(f"the bundle's model {settings.pulled_name} is still being pulled (it would be served "
                         f"once it is): wait for it, or pull it again later with everycycle models pull")
    if name is None:
        model, what = "", "the built-in model"
    else:
        manifest = store.get(name)
        if manifest.pooling:
            raise StoreError(f"{name} is an embedding model ({manifest.pooling} pooling): it cannot answer chat "
                             "requests; it is loaded when a request names it")
        model, what = str(store.path_of(manifest).resolve()), name
    if settings.serving(model) == settings:
        return f"{what} is already the default ({settings_path})"
    settings_file.save(settings.serving(model), settings_path)
    done = f"default model: {what} (written to {settings_path})"
    socket = supervisor_socket(runs or run_dir())
    if not restart or not socket.exists():
        return done + "; it is served from the serving service's next start" + \
            ("" if not restart else f" (no supervisord at {socket} to restart it now)")

    say("restarting the serving service…")
    try:
        return done + "; " + restart_service(socket, "serving")
    except Exception as exc:  # supervisord's faults and the socket's errors, said as they are
        raise StoreError(f"the setting is written, but restarting serving failed: {exc} (supervisorctl restart "
                         "serving)") from None


def remove(store: Store, name: str, *, force: bool = False, runs: Path | None = None, say=lambda line: None) -> str:
    """Remove a model: a pinned one or one being served only with force (which unloads it first)."""
    manifest = store.get(name)
    if manifest.pinned and not force:
        raise StoreError(f"{name} is pinned: unpin it first (everycycle models pin --off {name}), or --force")
    if name in loaded_models(runs):
        if not force:
            raise StoreError(f"{name} is loaded and being served: --force unloads it first")
        _unload(name, runs)
        say(f"unloaded {name}")
    store.remove(name)
    return f"removed {name}"


def _pool(runs: Path | None):
    """The serving service's engine pool (its control socket), which knows what is loaded."""
    return PoolClient(str((runs or run_dir()) / "serving" / "models.sock"))


def loaded_models(runs: Path | None = None) -> set[str]:
    """The models with an engine now; none when the serving service is not running."""
    try:
        rows = _pool(runs).models()
    except (EngineUnavailable, OSError):
        return set()
    return {r.id for r in rows if r.state in ("loaded", "loading")}


def _unload(name: str, runs: Path | None) -> None:
    try:
        _pool(runs).unload(name)
    except (EngineUnavailable, OSError) as exc:
        raise StoreError(f"could not ask the serving service to unload {name}: {exc}") from None
    except RequestRejected as exc:
        raise StoreError(exc.message) from None
