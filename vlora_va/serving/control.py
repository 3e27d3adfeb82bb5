"""The control socket: load, unload and list adapters in a running daemon (ZeroMQ REQ/REP, loopback by default).

    vlora-va adapters load NAME DIR [--pin]  ─►  {"op": "load", "name": ..., "path": ..., "pin": ...}
    vlora-va adapters unload NAME           ─►  {"op": "unload", "name": ...}
    vlora-va adapters list                  ─►  {"op": "list"}
    every reply: {"ok": true, ...} or {"ok": false, "error": "what is wrong"}

The server runs on its own thread: it reads and checks an adapter's files there (safetensors only), so
serving goes on meanwhile; the daemon thread then puts the prepared adapter into a slot between two batches
(a copy into pre-allocated stacks) and the reply says what happened (slot, evicted adapter, content hash).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from vlora_va.contracts.security import CurveConfig, bind_server, close_server, curve_client
from vlora_va.engine.adapters import Adapter, AdapterError, load_adapter_dir

log = logging.getLogger(__name__)

REQUEST_MAX_BYTES = 64 * 1024
APPLY_TIMEOUT_S = 120.0  # the longest a load waits for the daemon thread (a batch in progress)


def control_endpoint(configured: str, data_endpoint: str) -> str:
    """daemon.control_endpoint, or derived from the data endpoint: tcp port + 1 on loopback, ipc path +
    '.control'."""
    if configured:
        return configured
    if data_endpoint.startswith("ipc://"):
        return data_endpoint + ".control"
    if data_endpoint.startswith("tcp://"):
        port = int(data_endpoint.rsplit(":", 1)[1])
        return f"tcp://127.0.0.1:{port + 1}"
    return ""


@dataclass
class Operation:
    """One adapter operation, prepared off the serving path, applied by the daemon thread."""

    op: str  # "load" | "unload" | "list"
    name: str = ""
    adapter: Adapter | None = None
    pin: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict = field(default_factory=dict)


class ControlServer:
    def __init__(self, endpoint: str, hidden: int, operations: "queue.Queue[Operation]", loading: set[str],
                 curve: CurveConfig | None = None):
        """operations: where prepared operations go for the daemon thread; loading: names being read now (the
        daemon holds requests for them instead of answering 'unknown adapter'); curve: the daemon's CURVE keys
        (security.curve): only authorised clients may load or unload."""
        self.endpoint, self.hidden, self.operations, self.loading = endpoint, hidden, operations, loading
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, REQUEST_MAX_BYTES)
        self._auth = bind_server(self._ctx, self._sock, endpoint, curve, "daemon.control_endpoint")
        self._thread = threading.Thread(target=self._run, name="control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        close_server(self._ctx, self._sock, self._auth)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._sock.poll(100):
                    continue
                raw = self._sock.recv()
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    return
                log.error("control socket: %s", e)
                continue
            try:
                reply = self._handle(raw)
            except Exception as e:  # noqa: BLE001 - one bad request must not end the control thread
                log.exception("control request failed")
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            self._sock.send(json.dumps(reply).encode())

    def _handle(self, raw: bytes) -> dict:
        try:
            req = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            return {"ok": False, "error": "request is not UTF-8 JSON"}
        if not isinstance(req, dict) or req.get("op") not in ("load", "unload", "list"):
            return {"ok": False, "error": "expected {\"op\": \"load\" | \"unload\" | \"list\", ...}"}
        name = req.get("name", "")
        if req["op"] != "list" and (not isinstance(name, str) or not name):
            return {"ok": False, "error": "a load or unload needs the adapter's \"name\""}
        op = Operation(req["op"], name, pin=bool(req.get("pin", False)))
        if op.op == "load":
            path = req.get("path")
            if not isinstance(path, str) or not Path(path).is_absolute():
                return {"ok": False, "error": "a load needs the adapter directory as an absolute \"path\""}
            self.loading.add(name)
            try:
                op.adapter = load_adapter_dir(name, path, self.hidden)  # read and checked here, not when serving
            except AdapterError as e:
                self.loading.discard(name)
                return {"ok": False, "error": str(e)}
        self.operations.put(op)
        if not op.done.wait(APPLY_TIMEOUT_S):
            return {"ok": False, "error": f"the daemon did not apply the {op.op} within {APPLY_TIMEOUT_S:.0f} s"}
        return op.reply


def request(endpoint: str, message: dict, timeout_s: float = 150.0, curve: CurveConfig | None = None) -> dict:
    """Send one request to a daemon's control socket and return its reply (raises TimeoutError). curve: this
    client's CURVE keys (security.curve) where the daemon requires them; a daemon that refuses the key never
    answers, so that too ends in TimeoutError."""
    client = curve_client(curve)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    if client is not None:
        client.secure(sock)
    try:
        sock.connect(endpoint)
        sock.send(json.dumps(message).encode())
        if not sock.poll(int(timeout_s * 1000)):
            raise TimeoutError(f"no answer from the daemon's control socket {endpoint} in {timeout_s:.0f} s")
        return json.loads(sock.recv().decode())
    finally:
        sock.close()
        ctx.term()
