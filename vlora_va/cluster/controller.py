"""The cluster controller: `vlora-va run --cluster local|auto|ray://host:port`.

    connect to Ray ─► collector actor ─► daemon actors (custom resource, restarted by Ray) ─► each stream's cost
    ─► placement (affinity, then load) ─► unused adapters unloaded ─► ingest actors (by stream group) ─► watch:
        a daemon died       → its streams move to the others now; every chunk it owed gets a "daemon lost" row
        a daemon came back  → (Ray restarted it, or add_daemon) it takes about the mean load
        one stays overloaded→ its lowest-priority streams move to daemons with headroom (hysteresis)
        an ingest actor died→ its cameras restart elsewhere, its files end (ingest_actors.py)
        the head is lost    → the run drains now, while the other nodes still run (HeadWatch; exit 3)
    ─► sources ended or stop ─► ingest flushes ─► daemons drain ─► ingest released ─► collector flushes the sinks

A move: the target loads the stream's adapters first (through its control socket), then ingest re-points the
stream (queued chunks follow; what the old socket holds lingers to a live daemon), the old daemon releases the
stream (its tracks end: they restart on the new daemon; its counts continue: the collector carries them), and a
`stream_moved` event says so. Ray is imported only here, in ray_connection.py (connect: a local instance or an
existing cluster) and in the actor wrappers: a plain `vlora-va run` never imports it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path

from vlora_va.cluster import placement
from vlora_va.cluster.hosts import READY_TIMEOUT_S, CollectorHost, DaemonHost, address_and_free_port
from vlora_va.cluster.ingest_actors import IngestActors, IngestStartError
from vlora_va.cluster.ray_connection import ClusterError, HeadWatch, connect
from vlora_va.contracts.cluster import DAEMON_RESOURCE, NODE_LABEL_KEY, DaemonSpec
from vlora_va.contracts.config import PipelineConfig
from vlora_va.contracts.events import EventRecord
from vlora_va.serving.admission import TARGET_UTILISATION

log = logging.getLogger(__name__)

CAPACITY = TARGET_UTILISATION  # the load a daemon is placed up to, as admission fills one
UNLOAD_DELAY_S = 15.0  # an adapter no stream of a daemon uses any more is unloaded after this (in-flight work first)
LINGER_S = 5.0  # a moved stream's chunks already handed to ZeroMQ get this long to reach the live old daemon
CALL_TIMEOUT_S = 30.0
STATUS_EVERY_S = 1.0
PING_TIMEOUT_S = 5.0


class HeadLost(Exception):
    """Ray's head stopped answering (HeadWatch): the run drains while the other nodes' processes still run."""


@dataclasses.dataclass
class DaemonState:
    spec: DaemonSpec
    actor: object
    info: dict | None = None  # from DaemonHost.ready(): endpoint, adapters, pid...
    alive: bool = False
    ready_ref: object = None  # a pending ready() (starting, or restarting after a death)
    utilisation: float = 0.0
    unload_at: dict = dataclasses.field(default_factory=dict)  # adapter -> when to unload it if still unused


class Controller:
    def __init__(self, config: PipelineConfig, address: str = "local", log_level: str = "INFO",
                 policy: str = "affinity"):
        if not config.cluster.enabled:
            raise ClusterError(f"{config.source_file or 'the pipeline'}: no cluster: section (daemons to start)")
        self.config, self.address, self.log_level, self.policy = config, address, log_level, policy
        c = config.cluster
        self.watch = placement.OverloadWatch(c.rebalance_high, c.rebalance_low, c.rebalance_after_s)
        self.daemons: dict[str, DaemonState] = {}
        self.assignment: dict[str, str] = {}  # stream id -> daemon name
        self.loads: list[placement.StreamLoad] = []
        self.ingest = IngestActors(config, log_level, address == "local", self._offline_event, self._route_of)
        self.collector = None
        self.moves: list[dict] = []  # every move, with its time (the failover bench reads these)
        self._started_ray = False
        self._events_n = 0
        self._next_status = 0.0
        self._run_id = f"{int(time.time()):x}"
        self.head = HeadWatch() if address != "local" else None  # (a local Ray ends only with this process)
        self.head_lost = False

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        self._started_ray = connect(self.address, self.config)  # first: it may set Ray's mode before Ray is imported
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        local = self.address == "local"
        self.host = "127.0.0.1" if local else ""  # "": each actor binds its node's address
        # The collector runs on this node, on a port chosen here: Ray restarts it with the same arguments, so a
        # restarted collector binds the same address and the daemons' PUSH sockets find it again.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # The address and the port are read on that node, not here: through Ray's client (ray://) this process
        # runs on another machine than the driver's node.
        host, port = ray.get(ray.remote(address_and_free_port).options(num_cpus=0, scheduling_strategy=here)
                             .remote(self.host), timeout=CALL_TIMEOUT_S)
        self.collector = ray.remote(CollectorHost).options(num_cpus=0, max_restarts=-1, scheduling_strategy=here) \
            .remote(self.config, host, port, self.log_level)
        self._collector_at = ray.get(self.collector.endpoint.remote(), timeout=CALL_TIMEOUT_S)
        for spec in self.config.cluster.daemons:
            self._start_daemon(spec, local)
        for d in self.daemons.values():
            self._wait_ready(d)
        self._measure_loads()
        alive = self._daemon_loads()
        self.assignment = placement.place(self.loads, alive, self.policy)
        for d in self.daemons.values():  # what no stream placed here uses is unloaded now (slots, mode switches)
            used = placement.daemon_adapters(self.assignment, self.loads).get(d.spec.name, set())
            for name in set(d.info["adapters"]) - used:
                self._adapter(d, "unload", name)
        self._log_placement("placed")
        try:
            self.ingest.start()
        except IngestStartError as e:
            raise ClusterError(str(e)) from None

    def _start_daemon(self, spec: DaemonSpec, local: bool) -> DaemonState:
        import ray

        options = {"num_cpus": spec.num_cpus, "resources": dict(spec.resources),
                   "max_restarts": self.config.cluster.max_restarts, "max_task_retries": 0}
        if spec.node_label and not local:
            options["label_selector"] = {NODE_LABEL_KEY: spec.node_label}
        actor = ray.remote(DaemonHost).options(name=f"vlora-daemon-{spec.name}-{self._run_id}", **options).remote(
            self.config, spec.name, self._collector_at, spec.threads, self.host, self.log_level)
        d = self.daemons[spec.name] = DaemonState(spec, actor)
        d.ready_ref = actor.ready.remote()
        return d

    def _wait_ready(self, d: DaemonState) -> None:
        import ray
        from ray.exceptions import RayError

        done, _ = ray.wait([d.ready_ref], timeout=READY_TIMEOUT_S)
        if not done:
            raise ClusterError(f"daemon {d.spec.name} was not ready in {READY_TIMEOUT_S:.0f} s: does a node offer "
                               f"its resources {dict(d.spec.resources)}"
                               f"{f' and label {NODE_LABEL_KEY}={d.spec.node_label}' if d.spec.node_label else ''}?")
        try:
            d.info = ray.get(d.ready_ref)
        except RayError as e:  # its constructor failed (no backbone, a bad device...): said in one line
            raise ClusterError(f"daemon {d.spec.name} could not start: {str(e).strip().splitlines()[-1]}") from None
        d.alive, d.ready_ref = True, None
        log.info("daemon %s ready at %s (pid %s on %s; adapters %s)", d.spec.name, d.info["endpoint"], d.info["pid"],
                 d.info["node"], ", ".join(d.info["adapters"]) or "none")

    def _measure_loads(self) -> None:
        """Each stream's cost, from a daemon's own cost model (daemons of one cluster run the same backbone)."""
        import ray

        first = next(d for d in self.daemons.values() if d.alive)
        need = ray.get(first.actor.stream_loads.remote([s.id for s in self.config.streams]), timeout=CALL_TIMEOUT_S)
        self.loads = [placement.StreamLoad(s.id, frozenset(t.adapter for t in s.tasks), need[s.id],
                                           max((t.priority for t in s.tasks), default=s.priority))
                      for s in self.config.streams]

    # ------------------------------------------------------------------ watching
    def step(self) -> None:
        """One round: deaths, returns, overload."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        now = time.time()
        pings = {name: d.actor.ping.remote() for name, d in self.daemons.items() if d.alive}  # all at once
        deadline = time.monotonic() + PING_TIMEOUT_S
        silent = set()  # missed this round's ping: cut off or busy
        for name, ref in pings.items():
            try:
                ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
            except GetTimeoutError:  # busy or cut off, not dead: only Ray's word that it is gone moves streams
                log.warning("daemon %s did not answer a ping within %.0f s", name, PING_TIMEOUT_S)
                silent.add(name)
            except RayActorError as e:
                self._lost(self.daemons[name], e)
        for d in list(self.daemons.values()):
            if not d.alive and d.ready_ref is not None:
                done, _ = ray.wait([d.ready_ref], timeout=0)
                if done:
                    self._came_back(d)
        self._unload_due(now)
        if now >= self._next_status:
            self._next_status = now + STATUS_EVERY_S
            if self.head is not None and not self.head_lost and self.head.lost():
                self.head_lost = True
                raise HeadLost()
            self._rebalance(now, silent)
            self.ingest.poll()  # where each camera stands: a lost ingest actor's cameras restart from there

    def _lost(self, d: DaemonState, why: Exception) -> None:

        t0 = time.time()
        d.alive = False
        name = d.spec.name
        log.error("daemon %s lost (%s); moving its streams", name, type(why).__name__)
        survivors = [x for x in self._daemon_loads() if x.name != name]
        if survivors:
            moves = placement.replace_lost(self.assignment, self.loads, survivors, name)
            self.watch.remember(moves, t0)  # no overload relief moves them again within the cooldown
            self._apply(moves, old_alive=False, t0=t0)
        else:
            log.error("no daemon left: the streams wait for one (ingest applies its drop policy)")
        # Every chunk the dead daemon owed gets a row, once its last rows (in the network) are in.
        self._collect("settle", name)
        chunks = []
        for actor in self.ingest.actors():
            chunks += self.ingest.call(actor, "take_sent", name) or []
        written = self._collect("lost", name, chunks)
        log.warning("daemon %s: %d chunk(s) it was sent, %s row(s) written for those it never answered; failover "
                    "took %.2f s", name, len(chunks), written, time.time() - t0)
        if self.config.cluster.max_restarts != 0:
            d.ready_ref = d.actor.ready.remote()  # Ray restarts it: it takes load again once ready

    def _came_back(self, d: DaemonState) -> None:
        import ray

        try:
            d.info = ray.get(d.ready_ref)
        except Exception as e:  # noqa: BLE001 - still restarting (or gone for good): ask again next round
            from ray.exceptions import ActorDiedError

            d.ready_ref = None if isinstance(e, ActorDiedError) else d.actor.ready.remote()
            if d.ready_ref is None:
                log.error("daemon %s is gone for good (%s)", d.spec.name, e)
            return
        d.alive, d.ready_ref = True, None
        log.info("daemon %s is back at %s (pid %s)", d.spec.name, d.info["endpoint"], d.info["pid"])
        waiting = sorted(s for s, on in self.assignment.items() if on == d.spec.name)
        if waiting:  # it was the last daemon: its streams waited for it, at its old address
            self._apply([placement.Move(s, None, d.spec.name, "daemon lost") for s in waiting], old_alive=False,
                        t0=time.time())
        self._joined(d)

    def add_daemon(self, spec: DaemonSpec) -> None:
        """A daemon more (the cluster grew): once ready it takes about the mean load."""
        if spec.name in self.daemons:
            raise ClusterError(f"daemon {spec.name!r} exists already")
        d = self._start_daemon(spec, self.address == "local")
        self._wait_ready(d)
        self._joined(d)

    def _joined(self, d: DaemonState) -> None:
        for name in set(d.info["adapters"]) - self._used_by(d.spec.name):
            self._adapter(d, "unload", name)  # it holds what its streams use, nothing else
        moves = placement.fill_joined(self.assignment, self.loads, self._daemon_loads(), d.spec.name)
        self.watch.remember(moves, time.time())
        self._apply(moves, old_alive=True, t0=time.time())

    def _rebalance(self, now: float, silent: set[str]) -> None:
        import ray

        alive = [d for d in self.daemons.values() if d.alive]
        # A daemon that missed this round's ping is not asked (a partition would hold the loop for every call's
        # timeout, and with it the failover of everyone else); the others share one ping's time.
        refs = {d.spec.name: d.actor.status.remote() for d in alive if d.spec.name not in silent}
        deadline = time.monotonic() + PING_TIMEOUT_S
        for name, ref in refs.items():
            try:
                self.daemons[name].utilisation = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))[
                    "offered_load"]
            except Exception:  # noqa: BLE001 - a daemon dying now is the ping's business
                continue
        view = self.snapshot()
        for d in alive:  # each daemon's dashboard shows the cluster panel
            d.actor.cluster_view.remote(view)
        # utilisation: the offered load over what a daemon is placed up to (placement.OverloadWatch)
        for name in self.watch.update(now, {d.spec.name: d.utilisation / CAPACITY for d in alive}):
            moves = self.watch.relieve(self.assignment, self.loads, self._daemon_loads(), name, now)
            if moves:
                log.warning("daemon %s stayed overloaded: moving %d stream(s)", name, len(moves))
                self._apply(moves, old_alive=True, t0=now)
            else:  # said once per overload (the watch reports a daemon again only after it fell below low)
                log.warning("daemon %s stayed overloaded, but no other daemon has room for any of its streams below "
                            "rebalance_low (%.2f): none moves, and its admission control sheds its lowest priorities",
                            name, self.watch.low)

    # ------------------------------------------------------------------ moves
    def _apply(self, moves: list, old_alive: bool, t0: float) -> None:

        for m in moves:
            target = self.daemons[m.target]
            for adapter in self._adapters_of(m.stream) - set(target.info["adapters"]):
                self._adapter(target, "load", adapter)
            target.unload_at = {a: t for a, t in target.unload_at.items() if a not in self._adapters_of(m.stream)}
            self.ingest.call(self.ingest.by_stream[m.stream], "move", m.stream, target.info["endpoint"], m.target,
                             LINGER_S if old_alive else 0.0)
            source = self.daemons.get(m.source) if m.source else None
            if source is not None and old_alive and source.alive:
                source.actor.release_stream.remote(m.stream)
            self.assignment[m.stream] = m.target
            if source is not None and source.alive:
                for adapter in self._adapters_of(m.stream) - self._used_by(source.spec.name):
                    source.unload_at[adapter] = time.time() + UNLOAD_DELAY_S
            self.moves.append({"stream": m.stream, "from": m.source, "to": m.target, "reason": m.reason, "at": t0})
            self._moved_event(m)
        if moves:
            self._log_placement(moves[0].reason)

    def _moved_event(self, m) -> None:
        self._events_n += 1
        row = EventRecord(id=f"{self._run_id}-m{self._events_n}", event="stream_moved", stream=m.stream, ts=0.0,
                          captured_at=time.time(), extra={"from": m.source, "to": m.target, "reason": m.reason})
        self.collector.event.remote(row.to_json())

    def _unload_due(self, now: float) -> None:
        for d in self.daemons.values():
            for adapter, at in list(d.unload_at.items()):
                if now >= at:
                    del d.unload_at[adapter]
                    if d.alive and adapter not in self._used_by(d.spec.name):
                        self._adapter(d, "unload", adapter)

    def _adapter(self, d: DaemonState, op: str, name: str) -> None:
        import ray
        from ray.exceptions import RayActorError

        path = str(Path(self.config.adapters[name]).resolve()) if op == "load" else ""
        try:
            reply = ray.get(d.actor.adapter.remote(op, name, path), timeout=CALL_TIMEOUT_S + 150)
        except RayActorError as e:  # it died meanwhile: the next ping says so and its streams move
            log.error("daemon %s: adapter %s %s failed: %s", d.spec.name, name, op, type(e).__name__)
            return
        if reply.get("ok"):
            held = set(d.info["adapters"])
            d.info["adapters"] = sorted(held | {name} if op == "load" else held - {name})
        else:
            log.error("daemon %s: adapter %s %s refused: %s", d.spec.name, name, op, reply.get("error"))

    def _collect(self, method: str, *args, timeout: float = CALL_TIMEOUT_S):
        """A call to the collector; None (said) when it fails: Ray restarts a collector that died, and rows wait in
        the daemons' PUSH sockets meanwhile, but what this call carried (a dead daemon's lost rows) is not written."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(getattr(self.collector, method).remote(*args), timeout=timeout)
        except (RayActorError, GetTimeoutError) as e:
            log.error("the collector did not take %s (%s)", method, type(e).__name__)
            return None

    def _route_of(self, stream: str) -> tuple[str, str]:
        """Where a stream's chunks go now: (its daemon's endpoint, its daemon's name)."""
        name = self.assignment[stream]
        return self.daemons[name].info["endpoint"], name

    def _offline_event(self, stream: str, extra: dict) -> None:
        """A stream_offline event in the rows: its ingest is gone for good (none once the run has ended)."""
        if self.collector is None:
            return
        self._events_n += 1
        row = EventRecord(id=f"{self._run_id}-i{self._events_n}", event="stream_offline", phase="start",
                          stream=stream, ts=0.0, captured_at=time.time(), extra=extra)
        self.collector.event.remote(row.to_json())

    # ------------------------------------------------------------------ what is where
    def _adapters_of(self, stream: str) -> set[str]:
        return {t.adapter for t in self.config.stream(stream).tasks}

    def _used_by(self, daemon: str) -> set[str]:
        return set().union(*(self._adapters_of(s) for s, d in self.assignment.items() if d == daemon))

    def _daemon_loads(self) -> list:
        return [placement.DaemonLoad(d.spec.name, CAPACITY, d.info["max_slots"], frozenset(d.info["adapters"]))
                for d in self.daemons.values() if d.alive]

    def _log_placement(self, why: str) -> None:
        loads = placement.daemon_loads(self.assignment, self.loads)
        for name, d in self.daemons.items():
            streams = sorted(s for s, x in self.assignment.items() if x == name)
            log.info("cluster (%s): daemon %s%s: %d stream(s) %s, load %.2f, adapters %s", why, name,
                     "" if d.alive else " (down)", len(streams), ", ".join(streams), loads.get(name, 0.0),
                     ", ".join(d.info["adapters"]) if d.info else "-")

    def snapshot(self) -> dict:
        """Where everything is (the cluster panel, `vlora-va run --cluster` logs, tests)."""
        loads = placement.daemon_loads(self.assignment, self.loads)
        return {"daemons": {n: {"alive": d.alive, "endpoint": d.info["endpoint"] if d.info else None,
                                "pid": d.info["pid"] if d.info else None,
                                "adapters": d.info["adapters"] if d.info else [], "load": round(loads.get(n, 0.0), 3),
                                "utilisation": d.utilisation}
                            for n, d in self.daemons.items()},
                "streams": dict(self.assignment), "moves": list(self.moves)}

    # ------------------------------------------------------------------ run and stop
    def sources_ended(self) -> bool:
        """Every stream has handed all its chunks to ZeroMQ (its source ended), or lost its ingest worker."""
        progress, asked = {}, set()
        while todo := [a for a in self.ingest.actors() if id(a) not in asked]:  # (a lost camera's new actor too)
            for actor in todo:
                asked.add(id(actor))
                got = self.ingest.call(actor, "progress")
                if got is None and actor not in self.ingest.lost:
                    return False  # unreachable for now, not gone: its streams may still have chunks to send
                progress.update(got or {})
        return all(p["flushed"] for p in progress.values())

    def run(self, stop: threading.Event | None = None) -> int:
        """Start, watch until the sources end or stop is set, shut down. Returns an exit code."""
        stop = stop or threading.Event()
        try:
            self.start()
            while not stop.is_set() and not self.sources_ended():
                self.step()
                stop.wait(self.config.cluster.ping_s)
            return 0 if self.shutdown() else 1
        except HeadLost:
            log.error("Ray's head does not answer: nothing can start or restart, and Ray ends the other nodes' "
                      "processes within RAY_gcs_rpc_server_reconnect_timeout_s (60 s by default). Draining the run "
                      "now: start the head again, then the run (docs/cluster.md#the-head-lost)")
            self.shutdown()
            return 3
        except ClusterError as e:
            log.error("%s", e)
            return 2
        finally:
            self.close()

    def shutdown(self) -> bool:
        """Ingest flushes, the daemons drain (every chunk they got is answered), ingest is released, the collector
        flushes the sinks. True when every daemon drained."""
        import ray

        self.ingest.stopping = True  # an ingest actor lost from now on is not restarted: the run is ending
        for a in self.ingest.actors():
            self.ingest.call(a, "stop")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.sources_ended():
            self.step()  # a daemon may die while the queues flush
            time.sleep(0.1)
        ok = True
        for d in self.daemons.values():
            if not d.alive:
                continue
            try:
                totals = ray.get(d.actor.stop.remote(), timeout=660)
                log.info("daemon %s drained: %s", d.spec.name, totals)
            except Exception as e:  # noqa: BLE001 - said, and the run fails
                log.error("daemon %s did not drain: %s", d.spec.name, e)
                ok = False
        self.ingest_report = {}  # stream id -> what its ingest worker did (chunks sent, dropped...)
        for a in self.ingest.actors():
            self.ingest_report.update(self.ingest.call(a, "release", timeout=120) or {})
        for sid, p in sorted(self.ingest_report.items()):  # what ingest itself says it did, in this run's own log
            st = p.get("stats") or {}
            log.info("stream %s: ingest sent %d chunk(s), dropped %d", sid, st.get("chunks_sent", 0),
                     st.get("chunks_dropped", 0))
        snap = self._collect("close", timeout=120) or {"rows": 0, "duplicates": 0, "lost": 0}
        log.info("collector: %d rows to the sinks, %d duplicates dropped, %d 'daemon lost' rows", snap["rows"],
                 snap["duplicates"], snap["lost"])
        self.collector = None
        return ok

    def close(self) -> None:
        """Release the actors (and Ray, when this controller started it)."""
        import ray

        if not ray.is_initialized():
            return
        for actor in [*(d.actor for d in self.daemons.values()), *self.ingest.actors(),
                      *([self.collector] if self.collector is not None else [])]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        if self._started_ray:
            ray.shutdown()


def run_cluster(config: PipelineConfig, address: str, log_level: str = "INFO",
                stop: threading.Event | None = None) -> int:
    """`vlora-va run --cluster ADDRESS`."""
    return Controller(config, address, log_level).run(stop)


__all__ = ["Controller", "ClusterError", "connect", "run_cluster", "DAEMON_RESOURCE"]
