"""The sending side of the fuzz test and bench/fuzz.py: a Sender that keeps the books of what each message is owed,
the cut-off check for an oversize part, and RowTail, the daemon's JSONL sink read as it grows."""

from __future__ import annotations

import json
import time

from vlora_va.contracts.results import JsonlFollower, is_result
from vlora_va.testing.message_builder import DISCONNECT, LIVE_STREAM, Message


class RowTail:
    """The daemon's JSONL sink read as it grows (it is flushed after every batch); rows of `watch` are indexed
    by chunk. keep=False keeps only those (a long run's file is read once at the end instead)."""

    def __init__(self, path, watch: str = LIVE_STREAM, keep: bool = True):
        self.path, self.watch, self.keep = path, watch, keep
        self.rows: list[dict] = []
        self.watched: dict[int, list[dict]] = {}
        self.count = 0
        self._follower = JsonlFollower(path)

    def poll(self) -> None:
        for line in self._follower.new_lines():
            self.count += 1
            if self.keep or f'"stream":"{self.watch}"' in line or f'"stream": "{self.watch}"' in line:
                row = json.loads(line)
                if not is_result(row):
                    continue  # event rows (a stream going offline) are not what this watches
                if self.keep:
                    self.rows.append(row)
                if row["stream"] == self.watch:
                    self.watched.setdefault(row["chunk"], []).append(row)

    def wait_for(self, chunk: int, n: int, timeout: float) -> list[dict]:
        """The watched stream's rows of `chunk` once there are n of them (fewer: timed out)."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            got = self.watched.get(chunk, [])
            if len(got) >= n or time.monotonic() > deadline:
                return got
            time.sleep(0.001)


class Sender:
    """Sends generated messages to a daemon and keeps the books: messages per kind, bytes, and for every request
    the rows it is owed (`expected`, a Counter) and the statuses they may have (`allowed`). A DISCONNECT message
    goes on a throwaway socket that ZeroMQ must cut off; the others on `push`, which raises zmq.Again when the
    daemon stopped reading (give it a SNDTIMEO)."""

    def __init__(self, ctx, push, endpoint: str, stall_s: float):
        import collections

        self.ctx, self.push, self.endpoint, self.stall_s = ctx, push, endpoint, stall_s
        self.sent: collections.Counter = collections.Counter()
        self.expected: collections.Counter = collections.Counter()
        self.allowed: dict[tuple, frozenset] = {}
        self.bytes = 0

    def send(self, msg: Message) -> None:
        self.sent[msg.kind] += 1
        self.bytes += msg.size
        if msg.kind == DISCONNECT:
            send_to_be_cut_off(self.ctx, self.endpoint, msg.parts, self.stall_s)
            return
        self.push.send_multipart(msg.parts)
        for stream, seq, task, statuses in msg.rows:
            self.expected[(stream, seq, task)] += 1
            self.allowed[(stream, seq, task)] = statuses


def send_to_be_cut_off(ctx, endpoint: str, parts: list[bytes], timeout_s: float) -> None:
    """A message with a part over ZMQ_MAXMSGSIZE, on a fresh PUSH socket: ZeroMQ must drop it and cut that
    peer off (the daemon never sees it). Raises AssertionError when the peer is not cut off in time."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    push = ctx.socket(zmq.PUSH)
    mon = push.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        push.connect(endpoint)
        push.send_multipart(parts)
        assert mon.poll(timeout_s * 1000), "ZeroMQ did not cut off a peer that sent a part over ZMQ_MAXMSGSIZE"
        assert recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        push.disable_monitor()
        mon.close(linger=0)
        push.close(linger=0)
