"""Transport: the daemon's PULL socket, read by its own thread so that a long batch never delays reading.

    PULL socket ─► one message ─► decode + validate (contracts.wire) ─► requests in the daemon's clock
                                   └─ malformed: counted, logged, dropped (never fatal)
                                ─► inbox (thread-safe) ─► the daemon loop

The thread stamps each message when it is read and never blocks on the daemon: when the daemon already holds
`max_images` images (inbox + queue), it stops reading, so backpressure reaches ingest's drop policy instead of
piling up here as memory. ZeroMQ itself drops any message part larger than the largest legal one
(ZMQ_MAXMSGSIZE), so no peer can make the daemon buffer gigabytes.

Clocks: a message carries the sender's `ready_wall` and `sent_wall`. `ClockOffset` estimates the daemon's
clock minus the sender's as the smallest (receive - sent) seen recently per stream (the least-delayed
message bounds the offset from above, within the transit time), so deadlines never compare two machines'
wall clocks directly.
"""

from __future__ import annotations

import collections
import heapq
import logging
import threading
import time
from dataclasses import dataclass

import zmq

from vlora_va.contracts.requests import Request
from vlora_va.contracts.security import CurveConfig, bind_server, close_server
from vlora_va.contracts.wire import MAX_PARTS, SourceStatus, WireError, decode_message, largest_part_bytes

log = logging.getLogger(__name__)

POLL_MS = 50
CLOCK_WINDOW_S = 600.0  # the offset estimate forgets samples older than this (clock drift is slow)
CLOCK_MAX_STREAMS = 4096  # stream ids with a clock estimate (each message may name a new one)
CLOCK_SAMPLES = 64  # recent messages per stream the offset is estimated from
CLOCK_ROBUST_RANK = 3  # ...as their third smallest (receive - sent): one wrong sent time is ignored
CLOCK_MAX_SKEW_S = 7 * 86400.0  # a sender whose clock is further off than this is refused, not believed


@dataclass(frozen=True)
class Malformed:
    parts: int
    reason: str


@dataclass(frozen=True)
class Received:
    """One decoded chunk: its requests (daemon clock) and what the daemon counts per chunk."""

    stream: str
    seq: int
    dropped_before: int
    requests: list[Request]
    clock_offset: float
    reconnects: int = 0  # ingest's counts for this stream so far
    decoded: int = 0


@dataclass(frozen=True)
class Heard:
    """A stream's source status from ingest (wire.SourceStatus), with when the daemon read it."""

    status: SourceStatus
    received: float


class ClockOffset:
    """Per stream: daemon clock - sender clock, estimated from (received - sent) of the stream's recent
    messages. Transit and queueing only ever add to that difference, so a small one is close to the true
    offset; the estimate is the third smallest of the last CLOCK_SAMPLES within the window, so one message with
    a wrong sent time (a clock jump, a hostile sender) cannot shift a stream's deadlines.

    Bounded whatever senders do: a stream id is forgotten once its samples have all left the window (it
    starts afresh if it comes back), and at most `max_streams` are kept (the least recently seen goes first)."""

    def __init__(self, window_s: float = CLOCK_WINDOW_S, max_streams: int = CLOCK_MAX_STREAMS,
                 max_samples: int = CLOCK_SAMPLES):
        self.window_s, self.max_streams, self.max_samples = window_s, max_streams, max_samples
        # stream -> its recent (received, offset) samples; ordered from least to most recently updated
        self._samples: collections.OrderedDict[str, collections.deque[tuple[float, float]]] = \
            collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._samples)

    def update(self, stream: str, sent: float, received: float) -> float:
        samples = self._samples.get(stream)
        if samples is None:
            samples = self._samples[stream] = collections.deque(maxlen=self.max_samples)
        else:
            self._samples.move_to_end(stream)  # now the most recently updated
        samples.append((received, received - sent))
        while samples[0][0] < received - self.window_s:
            samples.popleft()
        self._forget(received)
        offsets = heapq.nsmallest(CLOCK_ROBUST_RANK, (o for _, o in samples))
        return offsets[-1]

    def _forget(self, now: float) -> None:
        """Drop streams with no sample left in the window, and the least recent beyond max_streams."""
        while self._samples:
            oldest = next(iter(self._samples.values()))
            if len(self._samples) <= self.max_streams and oldest[-1][0] >= now - self.window_s:
                return
            self._samples.popitem(last=False)


class Transport:
    def __init__(self, endpoint: str, image_size: int, max_images: int, rcvhwm: int = 4,
                 curve: CurveConfig | None = None, snapshots: bool = False):
        """curve: the daemon's CURVE keys (security.curve): only authorised ingest workers get through.
        snapshots: some stream sends JPEGs with its chunks (larger message parts are then legal)."""
        self.endpoint, self.max_images = endpoint, max_images
        self.clock = ClockOffset()
        self.held_images = 0  # images the daemon holds outside the inbox (its queue): see hold()
        self._inbox: collections.deque = collections.deque()
        self._inbox_images = 0
        self._cond = threading.Condition()
        self._reading = threading.Event()
        self._stop = threading.Event()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, rcvhwm)  # small: backpressure reaches ingest, whose drop policy decides
        self._sock.setsockopt(zmq.RCVBUF, 1 << 20)  # the kernel buffer too: chunks hidden there are only latency
        self._sock.setsockopt(zmq.MAXMSGSIZE, largest_part_bytes(image_size, snapshots))
        self._sock.setsockopt(zmq.LINGER, 0)
        self._auth = bind_server(self._ctx, self._sock, endpoint, curve, "daemon.endpoint")
        self._thread = threading.Thread(target=self._run, name="transport", daemon=True)
        self.last_read = time.monotonic()

    def start(self) -> None:
        self._reading.set()
        self._thread.start()

    def pause(self) -> None:
        """Stop reading new messages (what is in the inbox stays)."""
        self._reading.clear()

    def close(self) -> None:
        self._stop.set()
        self._reading.set()
        if self._thread.is_alive():
            self._thread.join(10)
        close_server(self._ctx, self._sock, self._auth)

    # ------------------------------------------------------------------ the daemon side
    def hold(self, images: int) -> None:
        """The daemon holds this many images outside the inbox (its queue): reading stops while inbox + queue
        would pass max_images."""
        self.held_images = images

    def take(self, timeout_s: float) -> list:
        """Everything in the inbox (Received / Heard / Malformed), waiting up to timeout_s for the first."""
        with self._cond:
            if not self._inbox and timeout_s > 0:
                self._cond.wait(timeout_s)
            items = list(self._inbox)
            self._inbox.clear()
            self._inbox_images = 0
            self._cond.notify_all()
        return items

    @property
    def backlogged(self) -> bool:
        """The daemon holds as many images as it may: nothing is read now (heartbeats wait with the chunks)."""
        return not self._room()

    # ------------------------------------------------------------------ the thread
    def _room(self) -> bool:
        return self._inbox_images + self.held_images < self.max_images

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._reading.wait(0.1):
                continue
            with self._cond:
                if not self._room():
                    self._cond.wait(POLL_MS / 1000)
                    continue
            try:
                if not self._sock.poll(POLL_MS):
                    continue
                parts = self._recv_parts()
            except zmq.ZMQError as e:
                if self._stop.is_set():
                    return
                log.error("receive failed: %s", e)
                continue
            item = self._decode(parts, time.time())
            if not isinstance(item, Heard):  # heartbeats are no data in flight: a drain waits for chunks only
                self.last_read = time.monotonic()
            with self._cond:
                self._inbox.append(item)
                if isinstance(item, Received):
                    self._inbox_images += sum(r.num_images for r in item.requests)
                self._cond.notify_all()

    def _recv_parts(self) -> list:
        """One multipart message, keeping at most MAX_PARTS + 1 parts (the rest is read and dropped, so an
        endless message cannot grow memory; decode then rejects it)."""
        parts = [self._sock.recv(copy=False)]
        while parts[-1].more:
            part = self._sock.recv(copy=False)
            if len(parts) <= MAX_PARTS:
                parts.append(part)
            elif not part.more:
                break
        return parts

    def _decode(self, parts: list, received: float):
        try:
            chunk = decode_message(parts)
            if isinstance(chunk, SourceStatus):
                return Heard(chunk, received)
            h = chunk.header
            if abs(received - h.sent_wall) > CLOCK_MAX_SKEW_S:
                return Malformed(len(parts), f"header.sent_wall: the sender's clock is {(h.sent_wall - received) / 86400:+.0f} "
                                             f"days from the daemon's (more than {CLOCK_MAX_SKEW_S / 86400:.0f} days: refused)")
            offset = self.clock.update(h.stream, h.sent_wall, received)
            return Received(h.stream, h.seq, h.dropped_before, chunk.requests(received, offset), offset,
                            h.reconnects, h.decoded)
        except WireError as e:
            return Malformed(len(parts), str(e))
        except Exception as e:  # noqa: BLE001 - nothing one message holds may take the daemon down
            return Malformed(len(parts), f"{type(e).__name__}: {str(e)[:200]}")
