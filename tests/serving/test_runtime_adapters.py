"""Adapters loaded, reloaded and unloaded in a running daemon over its real control socket, while a stream is
served (tiny random-weight backbone)."""

from __future__ import annotations

import time

import pytest

from tests.serving.test_daemon import RunningDaemon, chunk_parts, config
from vlora_va.serving.control import control_endpoint, request
from vlora_va.testing.tiny import make_adapter


def control(d: RunningDaemon, op: str, **kw) -> dict:
    return request(control_endpoint("", d.cfg.daemon.endpoint), {"op": op, **kw}, timeout_s=60)


def served(d: RunningDaemon, seq: int, adapter: str, seed: int = 7) -> None:
    d.send(chunk_parts("cam", seq, [("t", adapter)], n_frames=2, frames_seed=seed))


def wait_rows(d: RunningDaemon, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while d.daemon.totals.answered < n and time.monotonic() < deadline:
        time.sleep(0.02)
    assert d.daemon.totals.answered >= n, f"{d.daemon.totals.answered} of {n} rows"


@pytest.fixture
def extra(tmp_path):
    """Three distinguishable action adapters for the tiny backbone (different LoRA and heads)."""
    return {f"extra{i}": make_adapter(tmp_path / f"extra{i}", "action", ["standing", "walking"],
                                      targets=("attention.q_proj", "mlp.fc1"), rank=4, seed=10 + i) for i in range(3)}


def test_load_use_reload_and_unload_while_serving(tmp_path, tiny_backbone_dir, tiny_adapters, extra):
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=4))
    served(d, 0, "extra0")  # not loaded yet: a clear error, the daemon goes on
    wait_rows(d, 1)
    reply = control(d, "load", name="extra0", path=str(extra["extra0"]))
    assert reply["ok"] and reply["slot"] == 1 and reply["slots"] == {"used": 2, "total": 4} and not reply["reloaded"]
    served(d, 1, "extra0")
    wait_rows(d, 2)
    # Reload the same name with other weights (and another head): rows that follow use only the new ones.
    reply = control(d, "load", name="extra0", path=str(extra["extra1"]))
    assert reply["ok"] and reply["reloaded"] and reply["slot"] == 1
    served(d, 2, "extra0")
    wait_rows(d, 3)
    listing = control(d, "list")
    assert [a["name"] for a in listing["adapters"]] == ["detect", "extra0"]
    reply = control(d, "unload", name="extra0")
    assert reply["ok"] and reply["slots"]["used"] == 1
    served(d, 3, "extra0")
    assert not control(d, "unload", name="extra0")["ok"]  # twice: said, not fatal
    rows = {r["chunk"]: r for r in d.finish()}
    assert rows[0]["status"] == "error" and "unknown adapter 'extra0'" in rows[0]["reason"]
    assert rows[1]["status"] == rows[2]["status"] == "ok"
    assert rows[3]["status"] == "error" and "unknown adapter 'extra0'" in rows[3]["reason"]
    assert rows[1]["provenance"]["adapter_sha256"] != rows[2]["provenance"]["adapter_sha256"]
    assert control_rows_equal_a_fresh_daemon(tmp_path, tiny_backbone_dir, tiny_adapters, extra, rows[2])


def control_rows_equal_a_fresh_daemon(tmp_path, tiny_backbone_dir, tiny_adapters, extra, reloaded_row) -> bool:
    """A daemon started with the new weights from the beginning gives the reloaded adapter's row exactly."""
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    d = RunningDaemon(config(fresh_dir, tiny_backbone_dir, {"detect": tiny_adapters["detect"], "extra0": extra["extra1"]},
                             max_slots=4))
    served(d, 2, "extra0")
    (row,) = d.finish()
    assert row["status"] == "ok"
    assert row["scores"] == pytest.approx(reloaded_row["scores"], abs=1e-5)
    assert row["provenance"]["adapter_sha256"] == reloaded_row["provenance"]["adapter_sha256"]
    return True


def test_a_full_daemon_evicts_the_least_recently_used_unpinned_adapter(tmp_path, tiny_backbone_dir, tiny_adapters, extra):
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=3))
    assert control(d, "load", name="a", path=str(extra["extra0"]))["ok"]
    assert control(d, "load", name="b", path=str(extra["extra1"]))["ok"]  # all 3 slots used now
    served(d, 0, "a")  # a is used after b was loaded: b is the least recently used
    wait_rows(d, 1)
    reply = control(d, "load", name="c", path=str(extra["extra2"]))
    assert reply["ok"] and reply["evicted"] == "b" and reply["slots"] == {"used": 3, "total": 3}
    assert [a["name"] for a in control(d, "list")["adapters"]] == ["detect", "a", "c"]
    # Pin what is left: nothing can be evicted, and the load is refused with the reason.
    assert control(d, "load", name="a", path=str(extra["extra0"]), pin=True)["ok"]
    assert control(d, "load", name="c", path=str(extra["extra2"]), pin=True)["ok"]
    refused = control(d, "load", name="d", path=str(extra["extra1"]))
    assert not refused["ok"] and "hold pinned adapters" in refused["error"]
    served(d, 1, "c")
    rows = d.finish()
    assert [r["status"] for r in rows] == ["ok", "ok"]


def test_bad_loads_are_refused_with_the_reason_and_change_nothing(tmp_path, tiny_backbone_dir, tiny_adapters):
    alien = make_adapter(tmp_path / "alien", "detection", ["x"], targets=("attention.qkv",), nonzero=False)
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=2))
    assert "does not exist" in control(d, "load", name="x", path=str(tmp_path / "nowhere"))["error"]
    assert "not a linear layer of this backbone" in control(d, "load", name="x", path=str(alien))["error"]
    assert "absolute" in control(d, "load", name="x", path="relative/dir")["error"]
    assert not request(control_endpoint("", d.cfg.daemon.endpoint), {"op": "explode"})["ok"]
    assert control(d, "list")["slots"] == {"used": 1, "total": 2}
    served(d, 0, "detect")
    assert [r["status"] for r in d.finish()] == ["ok"]


def test_requests_for_an_adapter_being_loaded_wait_for_it(tmp_path, tiny_backbone_dir, tiny_adapters, extra):
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=3))
    d.daemon.adapters.loading.add("late")  # as the control thread does while it reads the files
    served(d, 0, "late")
    d.send(chunk_parts("other", 0, [("t", "detect")], n_frames=2))  # taken in after it (one socket: in order)
    wait_rows(d, 1)
    assert d.daemon.totals.answered == 1  # the later chunk was answered; the held one not (as "unknown adapter")
    assert control(d, "load", name="late", path=str(extra["extra0"]))["ok"]
    rows = {r["stream"]: r for r in d.finish()}
    assert rows["other"]["status"] == "ok"
    assert rows["cam"]["status"] == "ok" and rows["cam"]["adapter"] == "late"


@pytest.fixture
def compile_gate(monkeypatch):
    """Holds the openvino backend's background compiles until the test opens it (or makes them fail): what a slow
    compile on a busy machine looks like, under the test's control."""
    import threading

    from vlora_va.engine.backends.openvino import OpenVINOBackbone

    gate = {"open": threading.Event(), "started": threading.Event(), "fail": False}
    real = OpenVINOBackbone.float_model

    def float_model(self, part, size, split, slot):
        if threading.current_thread().name.startswith("openvino-compile"):
            gate["started"].set()
            assert gate["open"].wait(60)
            if gate["fail"]:
                raise RuntimeError("out of memory (the test's)")
        return real(self, part, size, split, slot)
    monkeypatch.setattr(OpenVINOBackbone, "float_model", float_model)
    return gate


def test_an_adapter_loaded_at_run_time_compiles_beside_serving(tmp_path, tiny_backbone_dir, tiny_adapters, extra,
                                                             compile_gate):
    """daemon.backend openvino: a loaded adapter's models compile on their own thread. The other adapters are
    served meanwhile (no stall), the new one's requests wait and are then served by its own compiled model."""
    pytest.importorskip("openvino")
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=3,
                             backend="openvino"))
    reply = control(d, "load", name="late", path=str(extra["extra0"]))
    assert reply["ok"] and reply["compiling"] and compile_gate["started"].wait(30)
    served(d, 0, "late")  # held while its model compiles
    d.send(chunk_parts("other", 0, [("t", "detect")], n_frames=2))
    wait_rows(d, 1)  # answered while the compile is still held: serving did not wait for it
    assert d.daemon.totals.answered == 1 and "late" in d.daemon.adapters.waiting
    assert d.daemon.adapters.busy_share() > 0  # admission counts the compile's share of the cores off the capacity
    compile_gate["open"].set()
    rows = {r["stream"]: r for r in d.finish()}
    assert d.daemon.adapters.busy_share() == 0
    assert rows["other"]["status"] == "ok"
    assert rows["cam"]["status"] == "ok" and rows["cam"]["adapter"] == "late"
    slot = reply["slot"]
    assert any(k.startswith("upper") and k.endswith(f"slot {slot}") for k in d.daemon.engine.backend.compile_s)


def test_an_adapter_whose_compile_fails_is_taken_out_and_its_requests_told(tmp_path, tiny_backbone_dir,
                                                                          tiny_adapters, extra, compile_gate):
    pytest.importorskip("openvino")
    d = RunningDaemon(config(tmp_path, tiny_backbone_dir, {"detect": tiny_adapters["detect"]}, max_slots=3,
                             backend="openvino"))
    assert control(d, "load", name="late", path=str(extra["extra0"]))["compiling"]
    served(d, 0, "late")
    compile_gate["fail"] = True
    compile_gate["open"].set()
    wait_rows(d, 1)
    d.send(chunk_parts("other", 0, [("t", "detect")], n_frames=2))  # the daemon goes on
    rows = {r["stream"]: r for r in d.finish()}
    assert rows["cam"]["status"] == "error" and "failed to compile" in rows["cam"]["reason"]
    assert "out of memory (the test's)" in rows["cam"]["reason"] and rows["other"]["status"] == "ok"
    assert "late" not in d.daemon.engine.slots and "compile failed" in d.daemon.adapters.failed["late"]
