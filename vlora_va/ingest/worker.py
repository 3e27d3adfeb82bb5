"""The ingest worker: a few streams in one process, one ZeroMQ PUSH socket of chunks to the daemon (and one of
heartbeats).

    stream thread (one per stream)          main thread
    FrameSource -> Chunker -> ChunkQueue -> sender -> PUSH socket -> daemon's PULL
                                                   -> heartbeat PUSH socket (each stream's state, every 0.25 s)

Decoding runs in the stream threads (PyAV and OpenCV release the GIL). The queue is bounded
(IngestConfig.send_hwm) and its drop policy decides what a slow daemon costs: `drop_oldest` keeps
the newest chunks (bounded latency), `drop_newest` keeps the oldest, `block` stalls the sources.
The socket's own high-water mark is tiny so chunks wait in our queue, where they can be dropped,
not inside zmq, where they cannot. A stream that fails is logged and the others keep running.
A camera outage (an RTSP reconnect, or a stall) is logged when frames flow again, counted, and reported
in the next sent chunk of that stream (`outage_s`: the media seconds missing).
This process never imports torch: its two cores belong to decoding and to the daemon.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Union

import cv2
import zmq

from vlora_va.contracts.config import PipelineConfig, StreamConfig
from vlora_va.contracts.security import curve_client
from vlora_va.contracts.wire import HEARTBEAT_S, SourceStatus, encode_chunk
from vlora_va.ingest.chunk_queue import ChunkQueue, StreamStats
from vlora_va.ingest.chunker import Chunker, plan_chunk
from vlora_va.ingest.route import Route, SentLedger
from vlora_va.ingest.source import FrameSource, SourceError
from vlora_va.ingest.stream_position import StreamPosition

if TYPE_CHECKING:
    import multiprocessing.synchronize

    StopEvent = Union[threading.Event, multiprocessing.synchronize.Event]

log = logging.getLogger(__name__)

ZMQ_SNDHWM = 2  # messages zmq may hold; more waiting happens in ChunkQueue where drops are possible
FLUSH_TIMEOUT_S = 5.0  # once stop is set: time left for queued chunks
ENDED_FLUSH_TIMEOUT_S = 30.0  # once every stream ended by itself: time for each queued chunk to leave
POLL_S = 0.1  # how often blocked loops look at the stop event
LOG_EVERY_S = 5.0
MIN_SNDBUF = 64 * 1024
RELEASE_TIMEOUT_S = 600.0  # the longest a finished worker waits for the daemon's drained signal
FINAL_HEARTBEAT_WAIT_S = 10.0  # the streams' final state waits this long for room
HEARTBEAT_HWM = 4  # heartbeats queued in zmq at most (a newer one says more than an older one)


def plan_workers(config: PipelineConfig) -> list[list[str]]:
    """Stream ids grouped IngestConfig.streams_per_worker at a time, in config order: one list per worker."""
    ids = [s.id for s in config.streams]
    n = config.ingest.streams_per_worker
    return [ids[i:i + n] for i in range(0, len(ids), n)]


def run_ingest(config: PipelineConfig, stream_ids: list[str] | None = None, stop: StopEvent | None = None,
               flushed: StopEvent | None = None, release: StopEvent | None = None,
               resume: dict | None = None, route: Route | None = None, ledger: SentLedger | None = None) -> dict:
    """Run one ingest worker for `stream_ids` (default: all streams) until every stream has ended or
    `stop` (a threading or multiprocessing Event) is set; then flush the queue for up to FLUSH_TIMEOUT_S.
    Once flushed, sets `flushed` and keeps the socket connected until `release` is set (or, without
    `release`, for IngestConfig.close_grace_s): see _hold_connection.
    resume: stream id -> its StreamPosition (a supervisor's, kept across restarts of this worker).
    route, ledger (cluster mode, vlora_va/ingest/route.py): where the chunks go now (followed before each send) and
    the ledger of what was sent to which daemon.
    Returns per stream: chunks_sent, chunks_dropped, errors, reconnects, outages, outage_s, state (and chunks_made,
    last_error)."""
    streams = [config.stream(sid) for sid in stream_ids] if stream_ids is not None else list(config.streams)
    resume = resume or {}
    ended = [s.id for s in streams if resume.get(s.id) is not None and resume[s.id].ended]
    if ended:
        log.info("ingest worker: stream(s) %s already ended; not started again", ", ".join(ended))
        streams = [s for s in streams if s.id not in ended]
    cv2.setNumThreads(1)  # one OpenCV thread per stream thread; the cores are shared with decode and inference
    stats = {s.id: StreamStats() for s in streams}
    queue = ChunkQueue(config.ingest.send_hwm, config.ingest.drop_policy, stats)
    halt = threading.Event()  # tells stream threads to finish; set from the caller's stop or on our exit
    ctx = zmq.Context(io_threads=1)
    link = _Link(ctx, config, streams, route, ledger)
    beat = Heartbeat(link, stats)
    log.info("ingest worker: %d stream(s) %s -> %s (queue %d chunks, %s)", len(streams),
             ", ".join(s.id for s in streams), link.endpoint, queue.maxsize, queue.policy)
    threads = [threading.Thread(target=_stream_main, name=f"ingest-{s.id}", daemon=True,
                                args=(s, config, queue, stats[s.id], halt, resume.get(s.id))) for s in streams]
    for t in threads:
        t.start()
    clock = _FlushClock(stop, halt, threads)
    try:
        _send_loop(link, queue, stats, clock, beat, resume)
        halt.set()
        for t in threads:  # once flushed is said, no stream thread makes another chunk (a supervisor may start
            t.join(timeout=5.0)  # a new worker on their positions then)
        daemon_there = any(st.chunks_sent for st in stats.values())  # nothing reached it otherwise
        if daemon_there:  # the streams' last word (an ended file is not offline)
            beat.send(wait_s=FINAL_HEARTBEAT_WAIT_S)
        if flushed is not None:
            flushed.set()
        if daemon_there:  # nothing in flight otherwise
            _hold_connection(release, config.ingest.close_grace_s)
    finally:
        halt.set()
        link.close(linger_s=clock.left())
        ctx.term()
        for t in threads:
            t.join(timeout=1.0)
    unsent = 0
    while (chunk := queue.get(0)) is not None:
        stats[chunk.header.stream].chunks_dropped += 1
        unsent += 1
    if unsent:
        log.warning("ingest worker: %d queued chunk(s) could not be sent before the flush deadline", unsent)
    for sid, st in stats.items():
        log.info("stream %s: finished: %d chunks sent, %d dropped, %d errors, %d reconnects, %d outages (%.1f s)",
                 sid, st.chunks_sent, st.chunks_dropped, st.errors, st.reconnects, st.outages, st.outage_s)
    return {sid: {k: v for k, v in asdict(st).items() if k not in ("last_frame", "waiting")}
            for sid, st in stats.items()}


def _push_socket(ctx: zmq.Context, config: PipelineConfig, streams: list[StreamConfig], endpoint: str,
                 hwm: int = ZMQ_SNDHWM) -> zmq.Socket:
    client = curve_client(config.security.curve)  # CURVE: the daemon accepts only authorised workers
    sock = ctx.socket(zmq.PUSH)
    if client is not None:
        client.secure(sock)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing in zmq until the daemon is really connected
    # Kernel socket buffers autotune to megabytes: dozens of small chunks could hide there, out of reach
    # of the drop policy, as latency. One chunk's worth keeps the waiting in ChunkQueue.
    largest = max((_chunk_bytes(s, config.daemon.image_size) for s in streams), default=0)
    sock.setsockopt(zmq.SNDBUF, max(MIN_SNDBUF, largest))
    sock.connect(endpoint)
    return sock


class _Link:
    """The worker's two sockets to its daemon (chunks, heartbeats). Without a route they stay on daemon.endpoint;
    with one (cluster mode) `follow()` re-points both when the controller moved the streams: what the old chunk
    socket holds lingers for the route's linger_s (a live daemon still answers it), the heartbeats do not."""

    def __init__(self, ctx: zmq.Context, config: PipelineConfig, streams: list[StreamConfig], route: Route | None,
                 ledger: SentLedger | None):
        self.ctx, self.config, self.streams, self.route, self.ledger = ctx, config, streams, route, ledger
        self.version, self.endpoint, self.daemon, _ = route.current() if route else (0, config.daemon.endpoint, "", 0)
        self._open()
        if route is not None:
            route.mark_followed(self.version)

    def _open(self) -> None:
        self.sock = _push_socket(self.ctx, self.config, self.streams, self.endpoint)
        self.beat_sock = _push_socket(self.ctx, self.config, [], self.endpoint, hwm=HEARTBEAT_HWM)

    def follow(self) -> bool:
        """Re-point to the route's endpoint if it changed; True when it did."""
        if self.route is None:
            return False
        version, endpoint, daemon, linger_s = self.route.current()
        if version == self.version:
            return False
        self.sock.close(linger=int(linger_s * 1000))
        self.beat_sock.close(linger=0)
        log.info("ingest: streams %s now go to daemon %s at %s (was %s)", ", ".join(s.id for s in self.streams),
                 daemon or "?", endpoint, self.daemon or self.endpoint)
        self.version, self.endpoint, self.daemon = version, endpoint, daemon
        self._open()
        self.route.mark_followed(version)
        return True

    def sent(self, header) -> None:
        if self.ledger is not None:
            self.ledger.sent(self.daemon, header)

    def close(self, linger_s: float) -> None:
        self.sock.close(linger=int(linger_s * 1000))
        self.beat_sock.close(linger=0)


def _hold_connection(release: StopEvent | None, grace_s: float) -> None:
    """Stay connected after the last send. ZeroMQ loses the messages still in flight to a receiver that
    is throttled (its high-water mark reached) when the sender disconnects; the daemon reads them only
    as fast as it serves them. `vlora-va run` sets `release` once the daemon has drained."""
    if release is not None:
        if not release.wait(RELEASE_TIMEOUT_S):
            log.warning("ingest worker: the daemon did not report drained within %.0f s; closing", RELEASE_TIMEOUT_S)
    elif grace_s > 0:
        log.info("ingest worker: all chunks handed to ZeroMQ; staying connected %.0f s so the daemon can read them", grace_s)
        time.sleep(grace_s)


def _chunk_bytes(stream: StreamConfig, image_size: int) -> int:
    """Bytes of frame data in one of this stream's chunks."""
    return len(plan_chunk(stream.frames_per_chunk, stream.tasks)[0]) * image_size * image_size * 3


def _stream_main(stream: StreamConfig, config: PipelineConfig, queue: ChunkQueue, stats: StreamStats,
                 halt: threading.Event, state: StreamPosition | None = None) -> None:
    """Decode, chunk and queue one stream until it ends, fails, reaches max_chunks or halt is set. state: its
    position (continued where a previous worker left it, and kept current)."""
    stats.last_frame = time.monotonic()  # from the start: a source that never delivers goes offline too
    # Tasks that look at no more than half of a chunk's frames do not need the frames nothing refers to.
    sent = len(plan_chunk(stream.frames_per_chunk, stream.tasks)[0])
    source = FrameSource(stream.source, stream.fps, loop=stream.loop, realtime=stream.realtime,
                         name=stream.id, stop=halt, reconnect_initial_s=config.ingest.reconnect_initial_s,
                         reconnect_max_s=config.ingest.reconnect_max_s,
                         skip_nonref=config.ingest.skip_frames and 2 * sent <= stream.frames_per_chunk,
                         hw_decode=config.ingest.hw_decode)
    try:
        chunker = Chunker(stream, config.daemon.image_size, snapshots=config.snapshots)
        queue.filters[stream.id] = chunker.filters
        frames = _resumed(source, stream, chunker, state) if state is not None and state.started else source
        for frame in frames:
            stats.reconnects = source.reconnects
            stats.last_frame = time.monotonic()
            chunk = chunker.add(frame)
            if chunk is None:
                continue
            stats.chunks_made += 1
            if chunk.header.outage_s:
                stats.outages += 1
                stats.outage_s += chunk.header.outage_s
                log.warning("stream %s: source outage: %.2f s of media missing before chunk %d (%d reconnects so far)",
                            stream.id, chunk.header.outage_s, chunk.header.seq, source.reconnects)
            # What ingest did for this stream so far travels with the chunk: the daemon exports it per stream.
            chunk.header = replace(chunk.header, reconnects=source.reconnects, decoded=source.decoded)
            if state is not None:
                state.made(chunker.seq, frame.ts + 1.0 / stream.fps, frame.wall)
            stats.waiting = True  # waiting for the daemon (block policy), not for the source: not an outage
            queue.put(chunk, halt)
            stats.waiting = False
            stats.last_frame = time.monotonic()
            if stream.max_chunks and chunker.seq >= stream.max_chunks:
                log.info("stream %s: max_chunks=%d reached", stream.id, stream.max_chunks)
                break
            if halt.is_set():
                break
    except SourceError as e:
        stats.errors += 1
        stats.last_error = str(e)
        stats.state = "failed"
        log.error("%s; this stream stops, the worker's other streams go on", e)
    except Exception as e:  # a bug must not take the other streams down
        stats.errors += 1
        stats.last_error = f"{type(e).__name__}: {e}"
        stats.state = "failed"
        log.exception("stream %s: failed", stream.id)
    else:
        if not halt.is_set():
            stats.state = "ended"  # a file that ended is not offline
            if state is not None:
                state.ended = True  # by itself (end of file, max_chunks): a restarted worker leaves it alone
    finally:
        stats.reconnects = source.reconnects
        log.debug("stream %s: thread ends after %d chunks", stream.id, stats.chunks_made)


def _resumed(source, stream: StreamConfig, chunker: Chunker, state: StreamPosition):
    """The source's frames placed after where the stream's previous worker stopped: chunk numbers go on, and
    media time goes on with the wall time the stream was down as an outage on the first frame."""
    chunker.seq = state.next_seq
    shift = None
    for frame in source:
        if shift is None:
            step = 1.0 / stream.fps
            down = max(0.0, frame.wall - state.last_wall - step)
            shift = state.media_end + down - frame.ts
            log.warning("stream %s: resumed by a new ingest worker at chunk %d after %.1f s down (%d chunk(s) made "
                        "but not sent before)", stream.id, chunker.seq, down, max(0, state.next_seq - state.last_sent - 1))
            frame = replace(frame, ts=round(frame.ts + shift, 6), outage_s=round(frame.outage_s + down, 3))
        else:
            frame = replace(frame, ts=round(frame.ts + shift, 6))
        yield frame


class _FlushClock:
    """Once the worker starts finishing, queued chunks get a time to leave: an absent daemon must not keep a
    finished worker alive forever. Stop requested: FLUSH_TIMEOUT_S. Every stream ended by itself (files):
    ENDED_FLUSH_TIMEOUT_S, given again each time a chunk leaves: a daemon serving a file read as fast as possible
    takes a chunk only when a batch is done (seconds at a time on a CPU), and the file's last chunks must still
    reach it."""

    def __init__(self, stop: StopEvent | None, halt: threading.Event, threads: list[threading.Thread]):
        self.stop, self.halt, self.threads = stop, halt, threads
        self.deadline: float | None = None
        self.timeout_s = FLUSH_TIMEOUT_S

    def finishing(self) -> bool:
        if self.deadline is None:
            if self.stop is not None and self.stop.is_set():
                log.info("ingest worker: stop requested; flushing queued chunks for up to %.0f s", FLUSH_TIMEOUT_S)
                self.halt.set()
            elif any(t.is_alive() for t in self.threads):
                return False
            else:
                self.timeout_s = ENDED_FLUSH_TIMEOUT_S
            self.deadline = time.monotonic() + self.timeout_s
        return True

    def expired(self) -> bool:
        return self.finishing() and time.monotonic() > self.deadline

    def progress(self) -> None:
        """A chunk left: the daemon is reading; the streams having ended, the rest get the whole time again."""
        if self.deadline is not None and self.timeout_s == ENDED_FLUSH_TIMEOUT_S:
            self.deadline = time.monotonic() + self.timeout_s

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic()) if self.deadline is not None else 0.0


def _send_loop(link: _Link, queue: ChunkQueue, stats: dict[str, StreamStats], clock: _FlushClock,
               beat: "Heartbeat", resume: dict | None = None) -> None:
    """Send queued chunks until the worker is finishing and the queue is empty (or the flush time is up)."""
    resume = resume or {}
    # seq of each stream's last sent chunk (a resumed stream: the previous worker's)
    last_sent = {sid: resume[sid].last_sent if sid in resume else -1 for sid in stats}
    next_log = time.monotonic() + LOG_EVERY_S
    window = {sid: 0 for sid in stats}
    while True:
        if time.monotonic() >= next_log:
            _log_throughput(stats, window, queue)
            next_log = time.monotonic() + LOG_EVERY_S
        link.follow()  # heartbeats too go where the streams went
        beat.due()
        chunk = queue.get(POLL_S)
        if chunk is None:
            if clock.finishing() and (len(queue) == 0 or clock.expired()):
                return
            continue
        h = chunk.header
        # Every seq was either sent or dropped here, so the gap is exactly what this stream lost; the outage
        # of a dropped chunk is owed to the next one sent.
        lost_outage = queue.take_lost_outage(h.stream)
        header = replace(h, dropped_before=h.seq - last_sent[h.stream] - 1, sent_wall=time.time(),
                         outage_s=round(h.outage_s + lost_outage, 3) if lost_outage else h.outage_s)
        if not _send(link, encode_chunk(header, chunk.frames, chunk.jpegs), clock, beat):
            stats[h.stream].chunks_dropped += 1
            return
        link.sent(header)
        clock.progress()
        if header.dropped_before:
            log.warning("stream %s: %d chunk(s) dropped before chunk %d (daemon slower than the source; policy %s)",
                        h.stream, header.dropped_before, h.seq, queue.policy)
        log.debug("stream %s: sent chunk %d (%d frames)", h.stream, h.seq, len(chunk.frames))
        last_sent[h.stream] = h.seq
        if h.stream in resume:
            resume[h.stream].last_sent = h.seq
        stats[h.stream].chunks_sent += 1
        window[h.stream] += 1


class Heartbeat:
    """Each stream's SourceStatus every HEARTBEAT_S, so the daemon can tell a live stream that stopped delivering
    frames (offline) from one that ended. On its own socket: behind a slow daemon the chunk socket is full for
    seconds, and a heartbeat must not wait behind chunks (nor take their place). A heartbeat that does not fit is
    skipped: the next one follows."""

    def __init__(self, link: _Link, stats: dict[str, StreamStats]):
        self.link, self.stats = link, stats
        self._next = 0.0

    def due(self) -> None:
        """Send if HEARTBEAT_S has passed since the last one (called from the sender's loops)."""
        if time.monotonic() >= self._next:
            self.send()

    def send(self, wait_s: float = 0.0) -> None:
        """Every stream's state now; wait_s: how long the last one may wait for room (the others never wait)."""
        self._next = time.monotonic() + HEARTBEAT_S
        now = time.monotonic()
        for sid, st in self.stats.items():
            # waiting for room in the queue is the daemon's pace, not the source's silence. A stream's thread may
            # stamp last_frame after `now` was read: its age is then 0, not negative (which the wire refuses).
            age = 0.0 if st.waiting else max(0.0, now - st.last_frame) if st.last_frame else 1e9
            status = SourceStatus(stream=sid, state=st.state, frame_age_s=round(age, 3), sent_wall=time.time())
            sock = self.link.beat_sock
            if wait_s and not sock.poll(int(wait_s * 1000), zmq.POLLOUT):
                return
            try:
                sock.send(status.to_json(), flags=zmq.NOBLOCK)
            except zmq.Again:
                return


def _send(link: _Link, parts: list, clock: _FlushClock, beat: Heartbeat | None = None) -> bool:
    """Send one multipart message without copying the frames. Waits while the daemon is slow or absent
    (meanwhile the queue applies its drop policy); gives up only when the flush time is up. A route that changes
    meanwhile (the daemon died, cluster mode) is followed: the message goes to the new daemon."""
    while not clock.expired():
        link.follow()
        if beat is not None:
            beat.due()  # a long wait for the daemon is no reason to go quiet
        if link.sock.poll(int(POLL_S * 1000), zmq.POLLOUT):
            try:
                link.sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
                return True
            except zmq.Again:
                pass
    return False


def _log_throughput(stats: dict[str, StreamStats], window: dict[str, int], queue: ChunkQueue) -> None:
    parts = [f"{sid} {window[sid] / LOG_EVERY_S:.2f} chunks/s ({st.chunks_sent} sent, {st.chunks_dropped} dropped"
             f"{f', {st.reconnects} reconnects' if st.reconnects else ''}"
             f"{f', {st.outages} outages ({st.outage_s:.1f} s)' if st.outages else ''}"
             f"{f', {st.errors} errors' if st.errors else ''})"
             for sid, st in stats.items()]
    log.info("ingest: %s; queue %d/%d", "; ".join(parts), len(queue), queue.maxsize)
    for sid in window:
        window[sid] = 0
