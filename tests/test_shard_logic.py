"""The pieces of one model across boxes (#60) that need no second box: the wire's key, stunnel's settings, the
HELLO probe against a stand-in server, and the flags (tests/test_shard.py runs the real thing)."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from host_runtime.common.setting_rules import SettingsError
from host_runtime.gpu.rpc_devices import RPC_PROTOCOL
from host_runtime.shard.errors import ShardError
from host_runtime.shard.probe import hello
from host_runtime.shard.tunnel_conf import Route, client_conf, server_conf
from host_runtime.shard.wire_key import psk_identity, secrets_text, wire_psk

KEY = "fleet-key-of-this-fleet-0123456789"


def test_each_members_wire_key_comes_from_the_fleet_key_without_being_it():
    member, other = "10.0.0.3:50052", "[fd00::3]:50052"
    psk = wire_psk(KEY, member)
    assert len(psk) == 64 and int(psk, 16) >= 0
    assert wire_psk(KEY + "\n", member) == psk  # as the key file holds it
    assert wire_psk("another-fleet-key-0123456789", member) != psk
    assert wire_psk(KEY, other) != psk  # a member's key opens no other member's wire
    assert psk_identity(other) == "everycycle-shard--fd00--3--50052"  # no ':' for stunnel's IDENTITY:KEY lines
    own = secrets_text(KEY, [member])
    assert KEY not in own and own == f"everycycle-shard-10.0.0.3-50052:{psk}\n"
    assert secrets_text(KEY, [member, other]).splitlines() == [own.strip(), f"{psk_identity(other)}:{wire_psk(KEY, other)}"]


def test_stunnel_takes_only_tls_1_3_with_the_key():
    member = server_conf("10.0.0.3:50052", "127.0.0.1:4000", "127.0.0.1:4001", "/run/x/psk.txt", "/run/x/log")
    assert "accept = 10.0.0.3:50052\nconnect = 127.0.0.1:4000\n" in member
    assert "sslVersionMin = TLSv1.3" in member and "ciphers = PSK" in member
    assert "PSKsecrets = /run/x/psk.txt" in member and "cert" not in member and "client" not in member
    holder = client_conf([Route("member0", "127.0.0.1:4001", "10.0.0.3:50052"),
                          Route("member1", "127.0.0.1:4002", "10.0.0.4:50052")], "/run/y/psk.txt", "/run/y/log")
    assert holder.count("client = yes") == 2
    assert "PSKidentity = everycycle-shard-10.0.0.3-50052\n" in holder  # each route keyed as its member
    assert "PSKidentity = everycycle-shard-10.0.0.4-50052\n" in holder
    assert "[member1]\nclient = yes\naccept = 127.0.0.1:4002\nconnect = 10.0.0.4:50052\n" in holder
    assert holder.count("socket = r:SO_KEEPALIVE=1") == 2  # a member gone from the network is noticed


def _server(answer):
    """A loopback listener that reads one HELLO and replies answer(request) (None: closes at once)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            request = conn.recv(33)
            reply = answer(request)
            if reply is not None:
                conn.sendall(reply)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


def _hello_reply(major: int, minor: int, patch: int = 0) -> bytes:
    return struct.pack("<Q", 28) + bytes([major, minor, patch, 0]) + bytes(24)


def test_the_probe_asks_hello_as_ggml_does_and_refuses_another_protocol():
    seen = []
    port = _server(lambda request: seen.append(request) or _hello_reply(*RPC_PROTOCOL, 3))
    assert hello("127.0.0.1", port, member="10.0.0.3:50052") == (*RPC_PROTOCOL, 3)
    assert seen == [struct.pack("<BQ", 14, 24) + bytes(24)]
    newer = _server(lambda request: _hello_reply(RPC_PROTOCOL[0] + 1, 0))
    with pytest.raises(ShardError, match=rf"10.0.0.3:50052 speaks llama.cpp's RPC protocol {RPC_PROTOCOL[0] + 1}\.0"):
        hello("127.0.0.1", newer, member="10.0.0.3:50052")
    closed = _server(lambda request: None)
    with pytest.raises(ShardError, match="closed the connection: it is down, not serving as a shard host, or its "
                                         "fleet key differs"):
        hello("127.0.0.1", closed, member="10.0.0.3:50052")
    other = _server(lambda request: struct.pack("<Q", 4) + b"HTTP")
    with pytest.raises(ShardError, match="answered, but not as llama.cpp's RPC server"):
        hello("127.0.0.1", other, member="10.0.0.3:50052")
    silent = socket.create_server(("127.0.0.1", 0))  # listens, never accepts: a member busy with another holder
    try:
        with pytest.raises(ShardError, match="did not answer in 0.5 s"):
            hello("127.0.0.1", silent.getsockname()[1], member="10.0.0.3:50052", timeout=0.5)
    finally:
        silent.close()


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "fleet.key"
    path.write_text(KEY + "\n")
    path.chmod(0o600)
    return path


@pytest.mark.parametrize("argv, message", [
    (["--shard-host", "10.0.0.3:50052"], "--shard-host needs --shard-key-file"),
    (["--shard-key-file", "{key}"], "--shard-key-file goes with --shard-host"),
    (["--shard-host", "10.0.0.3", "--shard-key-file", "{key}"], "--shard-host: '10.0.0.3'"),
    (["--shard-host", "10.0.0.3:50052", "--shard-host", "10.0.0.3:50052", "--shard-key-file", "{key}"],
     "names a box twice"),
    (["--placement", "cpu", "--shard-host", "10.0.0.3:50052", "--shard-key-file", "{key}"],
     "not with --placement cpu"),
    (["--shard-host", "10.0.0.3:50052", "--shard-key-file", "{open_key}"], "has mode 0644; it must be 0600"),
    (["--shard-host", "10.0.0.3:50052", "--shard-key-file", "/nonexistent/fleet.key"],
     "--shard-key-file: cannot read /nonexistent/fleet.key"),
    (["--shard-host", "10.0.0.3:50052", "--shard-host", "10.0.0.5:50052", "--shard-key-file", "{wire_keys}"],
     "holds no wire key for 10.0.0.5:50052"),
])
def test_shard_flags_are_checked_before_anything_starts(argv, message, key_file, tmp_path, capsys):
    from host_runtime.cli import main

    readable = tmp_path / "open.key"
    readable.write_text(KEY)
    readable.chmod(0o644)
    wire_keys = tmp_path / "wire.keys"  # the members' own keys, one of them missing
    wire_keys.write_text(secrets_text(KEY, ["10.0.0.3:50052", "10.0.0.4:50052"]))
    wire_keys.chmod(0o600)
    argv = [a.format(key=key_file, open_key=readable, wire_keys=wire_keys) for a in argv]
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_the_shard_hosts_reach_the_engine_and_not_the_models_loaded_beside_it(key_file):
    from host_runtime.cli import build_parser, engine_options
    from host_runtime.engine.options import EngineOptions
    from host_runtime.shard.holder import ShardConfig

    parser = build_parser()
    args = parser.parse_args(["serve", "--shard-host", "10.0.0.3:50052", "--shard-host", "10.0.0.4:50052",
                              "--shard-key-file", str(key_file), "--gpu-layers", "6", "--tensor-split", "1,1",
                              "--models-memory-mib", "2048"])
    options = EngineOptions.from_json(engine_options(parser, args, None).to_json())
    # the holder's RAM for the model: what serve's models may take, so layers past it go to the members
    assert options.context.host_ram_bytes == 2048 << 20
    assert engine_options(parser, parser.parse_args(["serve"]), None).context.host_ram_bytes is None
    assert options.shards == ShardConfig(hosts=("10.0.0.3:50052", "10.0.0.4:50052"), key_file=str(key_file))
    assert options.context.n_gpu_layers == 6  # a CPU-only box's --gpu-layers: the members' devices take them
    assert not options.context.batch_invariant  # mixed batches across boxes, as llama-server --rpc batches
    assert options.for_on_demand("/store/other.gguf").shards == ShardConfig()


def test_a_member_refuses_to_start_with_a_key_file_others_can_read(tmp_path, capsys):
    from host_runtime.cli import main

    readable = tmp_path / "open.key"
    readable.write_text(KEY)
    readable.chmod(0o644)
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "shard-host", "--listen", "10.0.0.3:50052", "--key-file", str(readable)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "fleet shard-host: --key-file: " in err and "it must be 0600" in err, err
    with pytest.raises(SystemExit) as exc:  # its key is derived from the address holders name it by
        main(["fleet", "shard-host", "--listen", "0.0.0.0:50052", "--key-file", str(readable)])
    assert exc.value.code == 2 and "not 0.0.0.0:50052" in capsys.readouterr().err


def test_a_member_lends_what_it_can_spare_never_past_its_cap():
    from host_runtime.shard.facts import lendable_bytes

    gib = 1 << 30
    # the CPU: RAM available now, less the larger of 1 GiB and 5% (ggml calls all of it free)
    assert lendable_bytes("cpu", 64 * gib, 64 * gib, 40 * gib, None) == 40 * gib - int(3.2 * gib)
    assert lendable_bytes("cpu", 8 * gib, 8 * gib, 6 * gib, None) == 5 * gib
    assert lendable_bytes("cpu", 8 * gib, 8 * gib, 6 * gib, 2 * gib) == 2 * gib
    assert lendable_bytes("cpu", 8 * gib, 8 * gib, gib // 2, None) == 0
    # a GPU: its free memory less the larger of 512 MiB and 5%
    assert lendable_bytes("gpu", 23 * gib, 24 * gib, 0, None) == 23 * gib - int(1.2 * gib)


def test_the_facts_say_what_is_lent_and_time_the_link():
    from host_runtime.shard.facts import FactsServer, LentDevice, ask, facts_doc

    lent = [LentDevice("CUDA0", "NVIDIA GeForce RTX 3090", "gpu", 22 << 30, 24 << 30),
            LentDevice("CPU", "AMD EPYC", "cpu", 40 << 30, 64 << 30)]
    server = FactsServer(lambda: facts_doc(lent, "0.1.0", RPC_PROTOCOL))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        devices, link = ask("127.0.0.1", server.port, member="10.0.0.3:50052")
        assert devices == lent
        assert 0 < link.round_trip_ms < 1000 and link.mbytes_per_s > 0
        with socket.create_connection(("127.0.0.1", server.port)) as sock:  # anything else: the member hangs up
            sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
            assert sock.recv(100) == b""
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(ShardError, match="10.0.0.3:50052 did not say what it lends"):
        ask("127.0.0.1", server.port, member="10.0.0.3:50052")


def test_a_members_own_wire_key_is_checked_for_its_address(key_file, tmp_path, capsys):
    from host_runtime.cli import main
    from host_runtime.shard.wire_key import own_secret

    member = "10.0.0.3:50052"
    assert main(["fleet", "shard-key", "--member", member, "--key-file", str(key_file)]) == 0
    printed = capsys.readouterr().out
    assert printed == secrets_text(KEY, [member]) and KEY not in printed
    assert own_secret(printed, member) == printed
    with pytest.raises(ValueError, match="another address"):
        own_secret(printed, "10.0.0.4:50052")
    with pytest.raises(ValueError, match="IDENTITY:KEY"):
        own_secret(KEY + "\n", member)
    with pytest.raises(ValueError, match="not one IDENTITY:KEY line"):
        own_secret(secrets_text(KEY, [member, "10.0.0.4:50052"]), member)
    own = tmp_path / "own.key"
    own.write_text(printed)
    own.chmod(0o600)
    for argv, message in ((["--wire-key-file", str(own), "--listen", "10.0.0.4:50052"], "another address"),
                          (["--wire-key-file", str(own), "--key-file", str(key_file), "--listen", member],
                           "not allowed with argument")):
        with pytest.raises(SystemExit) as exc:
            main(["fleet", "shard-host", *argv])
        assert exc.value.code == 2 and message in capsys.readouterr().err
    own.chmod(0o644)
    with pytest.raises(SystemExit):
        main(["fleet", "shard-host", "--wire-key-file", str(own), "--listen", member])
    assert "it must be 0600" in capsys.readouterr().err


def test_a_holder_needs_no_fleet_key_only_its_members_wire_keys(key_file, tmp_path, capsys):
    """`fleet shard-key --member A --member B` prints the holder's file: a line per member, what the fleet key
    derives for them, and nothing of the key; serve's serving.toml names the members and that file (provisioning
    writes both from box.toml's [fleet] shard_hosts)."""
    from host_runtime.cli import build_parser, engine_options, main, serve_arguments
    from host_runtime.serving.settings import ServingSettings
    from host_runtime.shard.holder import ShardConfig, read_secrets
    from host_runtime.shard.wire_key import holder_secrets

    members = ["10.0.0.3:50052", "10.0.0.4:50052"]
    assert main(["fleet", "shard-key", "--member", members[0], "--member", members[1], "--key-file",
                 str(key_file)]) == 0
    printed = capsys.readouterr().out
    assert printed == secrets_text(KEY, members) and KEY not in printed
    holder_keys = tmp_path / "holder.keys"
    holder_keys.write_text(printed)
    holder_keys.chmod(0o600)
    # in the members' order, whichever order the file has; the fleet key's file gives the same secrets
    assert read_secrets(str(holder_keys), members[::-1]) == secrets_text(KEY, members[::-1])
    assert read_secrets(str(key_file), members) == printed
    with pytest.raises(ShardError, match="holds no wire key for 10.0.0.9:50052"):
        read_secrets(str(holder_keys), ["10.0.0.9:50052"])
    for text in ("two words\n", "id:not-a-key\n"):
        with pytest.raises(ValueError):
            holder_secrets(text, members)
    parser = build_parser()
    settings = ServingSettings(shard_hosts=tuple(members), shard_key_file=str(holder_keys))
    args = serve_arguments(parser.parse_args(["serve"]), settings)
    assert engine_options(parser, args, None).shards == ShardConfig(hosts=tuple(members), key_file=str(holder_keys))
    given = serve_arguments(parser.parse_args(["serve", "--shard-host", members[0], "--shard-key-file",
                                               str(key_file)]), settings)
    assert engine_options(parser, given, None).shards == ShardConfig(hosts=(members[0],), key_file=str(key_file))


def test_a_provisioned_member_lends_only_where_fleet_toml_says_so(key_file, tmp_path, capsys):
    from host_runtime.cli import main
    from host_runtime.common.settings_file import save
    from host_runtime.fleet.settings import FleetSettings

    idle = tmp_path / "idle.toml"
    save(FleetSettings(role="member"), idle)
    with pytest.raises(SystemExit) as exc:  # without --if-lending it is a mistake, said
        main(["fleet", "shard-host", "--settings", str(idle)])
    assert exc.value.code == 2 and "--listen: required (or --settings with shard_listen)" in capsys.readouterr().err
    lending = tmp_path / "lending.toml"
    save(FleetSettings(role="member", shard_listen="10.0.0.3:50052", shard_lend_mib=64,
                       shard_wire_key_file=str(tmp_path / "missing.key")), lending)
    with pytest.raises(SystemExit) as exc:
        main(["fleet", "shard-host", "--if-lending", "--settings", str(lending)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--wire-key-file: cannot read" in err and "missing.key" in err, err
    with pytest.raises(SettingsError, match="only used in a fleet"):
        FleetSettings(shard_listen="10.0.0.3:50052")
    with pytest.raises(SettingsError, match="shard_listen"):
        FleetSettings(role="member", shard_listen="0.0.0.0:50052")


def test_plan_fleet_reads_the_boxs_serving_settings(tmp_path, capsys):
    from host_runtime.cli import main
    from host_runtime.common.settings_file import save
    from host_runtime.serving.settings import ServingSettings

    with pytest.raises(SystemExit) as exc:
        main(["plan", "--fleet", "--settings", str(tmp_path / "none.toml")])
    assert exc.value.code == 2 and "none.toml: no such settings file" in capsys.readouterr().err
    alone = tmp_path / "serving.toml"
    save(ServingSettings(), alone)
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--fleet", "--settings", str(alone)])
    assert exc.value.code == 2 and "names no shard hosts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["plan", "--settings", str(alone)])
    assert exc.value.code == 2 and "--settings goes with --fleet" in capsys.readouterr().err
    with pytest.raises(SettingsError, match="shard_hosts\\[0\\]"):
        ServingSettings(shard_hosts=("0.0.0.0:50052",), shard_key_file="/k")
    with pytest.raises(SettingsError, match="shard_key_file"):
        ServingSettings(shard_hosts=("10.0.0.3:50052",))
