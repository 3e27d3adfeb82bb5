"""Issue 14, item 4: authenticated links. `vlora-va keys` makes the keys; with security.curve the daemon's data,
control and results sockets accept only clients that hold an authorised key (a client without CURVE, or with a
key the daemon does not know, is refused in the handshake, seen on its own socket monitor); sockets reachable
from the network without authentication are warned about. The daemon goes on serving authorised clients
correctly throughout."""

from __future__ import annotations

import dataclasses
import json
import logging
import stat
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.serving.test_daemon import RunningDaemon, chunk_parts, config
from vlora_va.cli import input_warnings, main
from vlora_va.contracts.config import ConfigError, SecurityConfig, parse_config
from vlora_va.contracts.security import CurveConfig, bind_warning, create_keys, curve_client, is_local_endpoint
from vlora_va.outputs.sinks import ZmqPubSink
from vlora_va.serving.control import control_endpoint, request
from vlora_va.serving.transport import Transport
from vlora_va.testing.harness import free_port
from vlora_va.testing.messages import make_seeing_detector, payload_difference, reference_payloads
from vlora_va.testing.tiny import TINY_IMAGE

HANDSHAKE_S = 30.0
FAILED = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}


@pytest.fixture
def keys(tmp_path) -> CurveConfig:
    k = create_keys(tmp_path / "keys")
    return CurveConfig(server_secret=str(k["server.key_secret"]), server_public=str(k["server.key"]),
                       client_secret=str(k["client.key_secret"]), client_public=str(k["client.key"]))


@pytest.fixture
def stranger(tmp_path, keys) -> CurveConfig:
    """A client that knows the daemon's public key but holds a key pair of its own the daemon never authorised."""
    other = create_keys(tmp_path / "other")
    return dataclasses.replace(keys, client_secret=str(other["client.key_secret"]))


def handshake(ctx: zmq.Context, kind: int, endpoint: str, curve: CurveConfig | None) -> int:
    """Connect a socket of `kind` (as an authorised client when curve is given) and return how its handshake
    with the daemon ended: zmq.EVENT_HANDSHAKE_SUCCEEDED or one of FAILED. The socket stays open (returned via
    the context), so a refused one keeps trying in the background."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    if curve is not None:
        curve_client(curve).secure(sock)
    mon = sock.get_monitor_socket()
    sock.connect(endpoint)
    deadline = time.monotonic() + HANDSHAKE_S
    try:
        while time.monotonic() < deadline:
            if mon.poll(200):
                event = recv_monitor_message(mon)["event"]
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED or event in FAILED:
                    return event
        raise AssertionError(f"no handshake outcome on {endpoint} in {HANDSHAKE_S:.0f} s")
    finally:
        sock.disable_monitor()
        mon.close(linger=0)
        if kind != zmq.SUB:
            sock.close(linger=0)


def test_keys_command_makes_what_a_pipeline_needs(tmp_path, capsys):
    assert main(["keys", str(tmp_path / "k")]) == 0
    files = {p.name: p for p in (tmp_path / "k").iterdir()}
    assert set(files) == {"server.key", "server.key_secret", "client.key", "client.key_secret"}
    for name, p in files.items():
        assert stat.S_IMODE(p.stat().st_mode) == (0o600 if name.endswith("_secret") else 0o644), name
        assert "secret-key" not in p.read_text() or name.endswith("_secret")
    snippet = capsys.readouterr().out  # the pipelines.yaml lines that use them
    text = "adapters: {a: a}\nstreams: [{id: s, source: v.mp4, tasks: [{adapter: a}]}]\n" + snippet
    curve = parse_config(text, "p.yaml", tmp_path).security.curve
    assert curve.server_side and curve.client_side
    assert main(["keys", str(tmp_path / "k")]) == 1  # never overwrites keys


BASE = "adapters: {a: a}\nstreams: [{id: s, source: v.mp4, tasks: [{adapter: a}]}]\nsecurity:\n  curve:\n"


@pytest.mark.parametrize("keys_yaml,key,message", [
    ("    server_secret: k/nosuch\n    client_public: k/client.key\n", "server_secret", "no such key file"),
    ("    server_secret: k/server.key\n    client_public: k/client.key\n", "server_secret", "holds no secret key"),
    ("    server_secret: k/server.key_secret\n", "client_public", "required beside server_secret"),
    ("    server_public: k/server.key\n", "client_secret", "required beside server_public"),
    ("    client_public: k/bogus.key\n    server_secret: k/server.key_secret\n", "client_public",
     "not a ZeroMQ certificate"),
    ("    server_secret: k/loose.key_secret\n    client_public: k/client.key\n", "server_secret",
     "readable by other users (mode 0644): chmod 600 it"),
])
def test_key_errors_name_the_key_path_and_line(tmp_path, keys_yaml, key, message):
    create_keys(tmp_path / "k")
    (tmp_path / "k" / "bogus.key").write_text("not a certificate\n")
    loose = tmp_path / "k" / "loose.key_secret"
    loose.write_text((tmp_path / "k" / "server.key_secret").read_text())
    loose.chmod(0o644)
    with pytest.raises(ConfigError) as e:
        parse_config(BASE + keys_yaml, "p.yaml", tmp_path)
    assert e.value.key_path == f"security.curve.{key}" and message in str(e.value)
    assert str(e.value).startswith("p.yaml:") and e.value.line >= 4


def test_a_client_without_the_key_is_refused_on_every_daemon_socket(tmp_path, tiny_backbone_dir, keys, stranger,
                                                                    caplog):
    seeing = make_seeing_detector(tmp_path / "seeing")
    cfg = config(tmp_path, tiny_backbone_dir, {"seeing": seeing}, results_endpoint=f"ipc://{tmp_path}/results.sock")
    d = RunningDaemon(dataclasses.replace(cfg, security=SecurityConfig(curve=keys)))
    d.push.close(linger=0)  # its plain PUSH is one more client without the key; the keyed ones are made below
    data, results = cfg.daemon.endpoint, cfg.daemon.results_endpoint
    control = control_endpoint("", data)
    ctx = zmq.Context()
    try:
        for endpoint, kind in ((data, zmq.PUSH), (control, zmq.REQ), (results, zmq.SUB)):
            assert handshake(ctx, kind, endpoint, None) in FAILED, endpoint  # no CURVE at all
            assert handshake(ctx, kind, endpoint, stranger) == zmq.EVENT_HANDSHAKE_FAILED_AUTH, endpoint
        with pytest.raises(TimeoutError):
            request(control, {"op": "list"}, timeout_s=3)  # without the key: no answer, ever
        assert request(control, {"op": "list"}, timeout_s=60, curve=keys)["adapters"][0]["name"] == "seeing"
        # An authorised subscriber and ingest: served, and correctly
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        curve_client(keys).secure(sub)
        sub.connect(results)
        assert handshake(ctx, zmq.SUB, results, keys) == zmq.EVENT_HANDSHAKE_SUCCEEDED
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        curve_client(keys).secure(push)
        push.connect(data)
        parts = chunk_parts("cam", 0, [("det", "seeing")], frames_seed=5)
        push.send_multipart(parts)
        assert sub.poll(60_000), "no result published to the authorised subscriber"
        topic, body = sub.recv_multipart()
        row = json.loads(body)
        want = reference_payloads(tiny_backbone_dir, {"seeing": seeing}, TINY_IMAGE, parts)["det"]
        assert topic == b"cam" and row["status"] == "ok" and payload_difference(row, want) is None
        assert d.daemon.totals.chunks == 1 and d.daemon.totals.malformed == 0  # nothing else got through
        assert d.thread.is_alive() and d.daemon.ready.is_set()
        sub.close()
        push.close()
    finally:
        d.stop.set()
        assert d.drained.wait(60)
        ctx.destroy(linger=0)
        d.ctx.term()
        d.thread.join(60)
    refused = [r.getMessage() for r in caplog.records if "refused a client whose CURVE key" in r.getMessage()]
    assert {m.split(":")[0] for m in refused} == {"daemon.endpoint", "daemon.control_endpoint",
                                                  "daemon.results_endpoint"}


def test_sockets_reachable_from_the_network_without_authentication_are_warned_about(tmp_path, keys, caplog):
    port = free_port()
    assert is_local_endpoint("tcp://127.0.0.1:5555") and is_local_endpoint("ipc:///tmp/x") and \
        is_local_endpoint("tcp://[::1]:5555") and is_local_endpoint("tcp://localhost:1")
    assert not is_local_endpoint("tcp://*:5555") and not is_local_endpoint("tcp://0.0.0.0:5555") and \
        not is_local_endpoint("tcp://eth0:5555") and not is_local_endpoint("tcp://10.1.2.3:5555")
    with caplog.at_level(logging.WARNING):
        Transport(f"tcp://0.0.0.0:{port}", TINY_IMAGE, 8).close()
        Transport(f"tcp://0.0.0.0:{port}", TINY_IMAGE, 8, curve=keys).close()  # authenticated: no warning
        Transport(f"ipc://{tmp_path}/d.sock", TINY_IMAGE, 8).close()
        with ZmqPubSink(f"tcp://*:{port}"):
            pass
    warned = [r.getMessage() for r in caplog.records if "WITHOUT authentication" in r.getMessage()]
    assert len(warned) == 2, warned
    assert warned[0].startswith(f"daemon.endpoint binds tcp://0.0.0.0:{port}, which is reachable from the network")
    assert warned[1].startswith("daemon.results_endpoint binds tcp://*:")
    assert bind_warning("tcp://*:1", False, "daemon.endpoint") and not bind_warning("tcp://*:1", True, "x")
    # `vlora-va validate` says the same before anything runs, the HTTP server included
    cfg = parse_config("daemon: {endpoint: 'tcp://*:5555', http_host: 0.0.0.0, http_port: 8765}\n"
                       "adapters: {a: a}\nstreams: [{id: s, source: v.mp4, tasks: [{adapter: a}]}]\n", "p.yaml", tmp_path)
    problems = input_warnings(cfg)
    assert any(p.startswith("daemon.endpoint binds tcp://*:5555") for p in problems)
    assert any(p.startswith("daemon.http_host is 0.0.0.0, not loopback") for p in problems)
