"""The ingest actors of a cluster run: started by stream group, called by the controller, and what happens when one
is lost (its process, or its whole host).

    start     `ingest.streams_per_worker` streams of one group per IngestHost actor, on a node with that group's
              label (a stream without a group: anywhere)
    watch     every second (`poll`), where each live stream stands (chunk numbers, media time: StreamPosition)
    lost      a file's stream ends, said in the rows (a stream_offline event, reason "ingest lost"): restarted, it
              would start the file over, chunk numbers and all.
              A live stream (a camera: RTSP) restarts in a new actor, on a live node of its group if there is one,
              else on any node (a camera is usually reachable from more than one machine). It continues from its
              last known position: chunk numbers go on past every number the lost actor may have used since (one
              per chunk_seconds since the position was read, plus one), media time goes on with the gap as an
              outage, and it reads the camera from its live edge, as a reconnecting camera does.

Ray is imported only inside the methods (the cluster extra is optional).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

from vlora_va.cluster.hosts import IngestHost
from vlora_va.contracts.cluster import NODE_LABEL_KEY
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.plugins import SOURCES, source_scheme

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0
START_TIMEOUT_S = 120.0
POLL_TIMEOUT_S = 2.0
MAX_RESTARTS = 5  # a camera's ingest restarted this often in a run ends (each restart is said in the log)


class IngestStartError(RuntimeError):
    """No node took a group's ingest actor in time."""


def is_live(config: PipelineConfig, stream: str) -> bool:
    """The stream's source is a camera (its Source says `live`): restarted elsewhere, it loses only the gap."""
    return bool(getattr(SOURCES.load(source_scheme(config.stream(stream).source)), "live", False))


class IngestActors:
    def __init__(self, config: PipelineConfig, log_level: str, local: bool, said: Callable[[str, dict], None],
                 route_of: Callable[[str], tuple[str, str]]):
        """local: one machine (no group labels); said(stream, extra): a stream_offline event for a stream whose
        ingest is gone for good; route_of(stream): where its chunks go now, (daemon endpoint, daemon name)."""
        self.config, self.log_level, self.local, self.said, self.route_of = config, log_level, local, said, route_of
        self.by_stream: dict[str, object] = {}  # stream id -> its IngestHost actor
        self.lost: set = set()
        self.positions: dict[str, tuple[list[float], float]] = {}  # live stream -> (its position, read at)
        self.restarts: dict[str, int] = {}  # live stream -> its ingest restarts so far
        self.stopping = False  # the run is ending: a lost actor's cameras are not restarted

    def actors(self) -> list:
        return list({id(a): a for a in self.by_stream.values()}.values())

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        """Every actor is asked for at once, each stream pointed at its daemon (route_of); returns once all have
        started."""
        groups: dict[str, list[str]] = {}
        for s in self.config.streams:
            groups.setdefault("" if self.local else s.group, []).append(s.id)
        n = self.config.ingest.streams_per_worker
        parts = [(group, ids[i:i + n]) for group, ids in groups.items() for i in range(0, len(ids), n)]
        started = [(group, self._spawn({sid: self.route_of(sid) for sid in part}, group, None))
                   for group, part in parts]
        deadline = time.monotonic() + START_TIMEOUT_S
        for group, actor in started:
            self._wait_started(actor, group, max(0.0, deadline - time.monotonic()))

    def _spawn(self, routes: dict[str, tuple[str, str]], group: str, resume: dict | None) -> object:
        """One actor for these streams on a node of `group` ("" anywhere), asked for (not waited for)."""
        import ray

        from vlora_va.ingest.stream_position import StreamPosition

        options = {"num_cpus": 0, "max_restarts": 0}
        if group:
            options["label_selector"] = {NODE_LABEL_KEY: group}
        actor = ray.remote(IngestHost).options(**options).remote(self.config, routes, self.log_level, resume)
        now = time.time()
        for sid in routes:
            self.by_stream[sid] = actor
            if is_live(self.config, sid) and sid not in self.positions:
                start = StreamPosition()
                start.made(0, 0.0, now)  # nothing made yet: media time 0, at the start
                self.positions[sid] = (start.values(), now)
        return actor

    def _wait_started(self, actor, group: str, timeout_s: float) -> None:
        """Until the actor runs; one whose node died as it started loses its streams (said, not a crash)."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            ray.get(actor.progress.remote(), timeout=timeout_s)
        except RayActorError as e:
            self.gone(actor, e)
        except GetTimeoutError:
            streams = sorted(s for s, a in self.by_stream.items() if a is actor)
            raise IngestStartError(f"streams {', '.join(streams)}: no node took their ingest worker in "
                                   f"{START_TIMEOUT_S:.0f} s (does a node carry label {NODE_LABEL_KEY}={group}?)") \
                from None

    # ------------------------------------------------------------------ calls
    def call(self, actor, method: str, *args, timeout: float = CALL_TIMEOUT_S):
        """A call to an ingest actor; None when it is gone (then `gone` has dealt with its streams) or unreachable
        for now (a cut link: only Ray's word that it died restarts a camera elsewhere, or two actors would number
        its chunks at once)."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        if actor in self.lost:
            return None
        try:
            return ray.get(getattr(actor, method).remote(*args), timeout=timeout)
        except ActorUnavailableError:
            return None
        except RayActorError as e:
            self.gone(actor, e)
            return None

    def poll(self) -> None:
        """Where each live stream stands now (every actor asked at once; one that does not answer in time keeps
        its last position: the gap to it is skipped on a restart)."""
        import ray

        live = [a for a in self.actors() if a not in self.lost
                and any(s in self.positions for s, x in self.by_stream.items() if x is a)]
        refs = {id(a): (a, a.positions.remote()) for a in live}
        deadline = time.monotonic() + POLL_TIMEOUT_S
        for actor, ref in refs.values():
            try:
                got = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - gone or slow: the next call to it says which
                continue
            now = time.time()
            for sid, values in got.items():
                if sid in self.positions:
                    self.positions[sid] = (values, now)

    # ------------------------------------------------------------------ loss
    def gone(self, actor, why: Exception) -> None:
        """An ingest actor died: its files' streams end (said in the rows), its cameras restart elsewhere."""
        if actor in self.lost:
            return
        self.lost.add(actor)
        streams = sorted(s for s, a in self.by_stream.items() if a is actor)
        live = [s for s in streams if s in self.positions and self.restarts.get(s, 0) < MAX_RESTARTS
                and not self.stopping]
        ended = [s for s in streams if s not in live]
        log.error("the ingest worker of streams %s is gone (%s)%s", ", ".join(streams), type(why).__name__,
                  f": {', '.join(live)} restart elsewhere" if live else "")
        for sid in ended:
            self.said(sid, {"reason": "ingest lost", "error": type(why).__name__})
        if live:
            self._restart(live)

    def _restart(self, streams: list[str]) -> None:
        from vlora_va.ingest.stream_position import StreamPosition

        now = time.time()
        resume = {}
        for sid in streams:
            values, read_at = self.positions[sid]
            position = StreamPosition(list(values))
            # every number the lost actor may have used since the position was read (a camera makes one chunk per
            # chunk_seconds), and one more: a number used twice would lose the second chunk's row as a duplicate
            position.skip(math.ceil((now - read_at) / self.config.stream(sid).chunk_seconds) + 1)
            resume[sid] = position
        group = self.config.stream(streams[0]).group
        group = group if group and not self.local and _label_alive(group) else ""
        for sid in streams:
            self.restarts[sid] = self.restarts.get(sid, 0) + 1
        routes = {sid: self.route_of(sid) for sid in streams}
        log.warning("streams %s: a new ingest worker %s; %s", ", ".join(streams),
                    f"on a node of group {group}" if group else "on any node (none of their group is left)",
                    ", ".join(f"{sid} goes on at chunk {p.next_seq}" for sid, p in resume.items()))
        actor = self._spawn(routes, group, {sid: p.values() for sid, p in resume.items()})
        try:
            self._wait_started(actor, group, START_TIMEOUT_S)
        except IngestStartError as e:  # no node took it: these cameras end here, said (the run goes on)
            log.error("%s: they stop", e)
            self.lost.add(actor)
            for sid in streams:
                self.said(sid, {"reason": "ingest lost", "error": "no node for a new ingest worker"})


def _label_alive(group: str) -> bool:
    """A live node carries this group's label."""
    import ray

    return any(n.get("Alive") and (n.get("Labels") or {}).get(NODE_LABEL_KEY) == group for n in ray.nodes())
