"""One root error for the box (#57: about 40 error classes derived straight from Exception, ValueError or
OSError, and cli.py needed 45 except clauses): every error the box raises on purpose is an EveryCycleError of one
family, mapped once to an exit code and once to an HTTP status."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import falcon
import falcon.testing
import pytest

import agent_bmc
import host_runtime
import provisioning
from host_runtime import cli
from host_runtime.common.errors import EveryCycleError, InputError, UnavailableError
from host_runtime.serving.errors import handle_api_error, handle_box_error, handle_unexpected

# Raised and caught inside one module to steer its control flow, never shown to anyone.
CONTROL_FLOW = {"EmbeddingCancelled", "ClientGone", "CorruptEntry", "_Stopped", "_Quiet"}
SKIP_MODULES = ("host_runtime.console", "host_runtime.cli")  # textual's UI and the entry point: no classes of ours


def project_exceptions() -> dict[str, type]:
    found = {}
    for package in (host_runtime, agent_bmc, provisioning):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith(SKIP_MODULES) or info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                    found[f"{module.__name__}.{name}"] = obj
    return found


def test_every_error_of_the_box_is_an_everycycle_error_of_one_family():
    found = project_exceptions()
    assert len(found) > 40
    strays = sorted(name for name, cls in found.items()
                    if not issubclass(cls, EveryCycleError) and cls.__name__ not in CONTROL_FLOW)
    assert strays == []
    # each keeps what callers catch it as
    from host_runtime.common.download import Stalled
    from host_runtime.common.http_client import HTTPFailure
    from host_runtime.common.setting_rules import SettingsError
    from host_runtime.models.errors import SourceRefused, StoreError

    assert issubclass(SettingsError, InputError) and issubclass(SettingsError, ValueError)
    assert issubclass(HTTPFailure, UnavailableError) and issubclass(HTTPFailure, OSError)
    assert issubclass(Stalled, OSError) and issubclass(SourceRefused, StoreError | InputError)


@pytest.mark.parametrize("error, code", [(InputError("model.path: not a file"), 2),
                                         (UnavailableError("the engine is not answering"), 69),
                                         (EveryCycleError("the update could not be staged"), 1)])
def test_the_cli_says_an_unhandled_box_error_with_its_familys_exit_code(monkeypatch, capsys, error, code):
    def failing(parser, args):
        raise error

    monkeypatch.setattr(cli, "cmd_keys", failing)
    assert cli.main(["keys", "list", "--keys", "/nonexistent/keys.json"]) == code
    err = capsys.readouterr().err
    assert err.strip() == f"everycycle keys: {error}" and "Traceback" not in err


def test_the_api_answers_an_unhandled_box_error_with_its_familys_status():
    class Raises:
        def on_get(self, req, resp, kind):
            raise {"input": InputError("temperature: must be at most 2"),
                   "unavailable": UnavailableError("the engine is not answering"),
                   "box": EveryCycleError("/var/lib/everycycle/secret: disk error")}[kind]

    app = falcon.App()
    app.add_route("/x/{kind}", Raises())
    app.add_error_handler(Exception, handle_unexpected)
    app.add_error_handler(EveryCycleError, handle_box_error)
    from host_runtime.engine.errors import RequestRejected
    app.add_error_handler(RequestRejected, handle_api_error)
    client = falcon.testing.TestClient(app)
    bad = client.simulate_get("/x/input")
    assert bad.status_code == 400 and bad.json["error"]["message"] == "temperature: must be at most 2"
    assert client.simulate_get("/x/unavailable").status_code == 503
    own = client.simulate_get("/x/box")
    assert own.status_code == 500 and "secret" not in own.text  # the box's own failure stays in its log
