"""Adapters at run time: which adapters the engine holds in its slots, and the operations that change that.

The control socket (control.py) reads and checks an adapter's files on its own thread and queues an `Operation`;
the daemon applies queued operations here between two batches, so a slot is never rewritten under a forward:
    load     into its own slot (a reload) or a free one; with none free, the least recently used adapter that is
             not pinned is evicted (its queued requests get error rows saying so)
    unload   frees the slot for real (stacks zeroed, premerged weights back to the base)
    list     what is where
While an adapter's files are being read, requests for it are held (not refused) until it is in, or answered with
an error row if it fails, or shed once their deadline passes. A backend that compiles per adapter (openvino)
compiles a loaded adapter on its own thread (`Engine.prepare`): serving goes on meanwhile, and the adapter's
requests stay held until its models are ready. The configured adapters are pinned. This file owns the catalog (what
the scheduler knows about the loaded adapters) and the adapters that failed to load.
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import Future

import torch

from vlora_va.contracts.requests import Request
from vlora_va.engine.executor import Engine
from vlora_va.engine.plan import Catalog
from vlora_va.serving.control import Operation
from vlora_va.serving.prometheus import DaemonMetrics
from vlora_va.serving.rows import RowWriter
from vlora_va.serving.scheduling import Scheduler

log = logging.getLogger(__name__)


class AdapterSlots:
    def __init__(self, engine: Engine, scheduler: Scheduler, row_writer: RowWriter, metrics: DaemonMetrics,
                 failed: dict[str, str]):
        self.engine, self.scheduler, self.row_writer, self.metrics = engine, scheduler, row_writer, metrics
        self.catalog: Catalog = engine.catalog()  # replaced whole on a load or unload, never changed in place
        self.failed = dict(failed)  # adapter name -> why it could not be loaded
        self.operations: queue.Queue[Operation] = queue.Queue()  # prepared on the control thread, applied here
        self.loading: set[str] = set()  # names whose files are being read: their requests wait
        self.compiling: dict[str, Future] = {}  # loaded, their backend models compiling: their requests wait too
        self.pinned: set[str] = set(self.catalog.adapters)  # the configured adapters are never evicted
        self._last_used: dict[str, float] = {}
        self._held: list[Request] = []
        self.metrics.slots_used.set(len(engine.slots))

    def used(self, names, when: float) -> None:
        """These adapters served a batch at `when` (least recently used goes first)."""
        for name in names:
            self._last_used[name] = when

    @property
    def waiting(self) -> set[str]:
        """Adapters whose requests are held: being read (a reload serves the old weights meanwhile) or compiling."""
        return {n for n in self.loading if n not in self.catalog.adapters} | set(self.compiling)

    def busy_share(self) -> float:
        """The share of the engine's cores a background compile takes while one runs (admission counts it off the
        capacity): one thread of the engine's (the compile thread runs one model at a time, and its trace and
        compile mostly keep one core busy)."""
        return 1.0 / max(1, torch.get_num_threads()) if self.compiling else 0.0

    # ------------------------------------------------------------------ held requests
    def hold(self, requests: list[Request]) -> None:
        """Requests whose adapter is being loaded: queued once it is in."""
        self._held.extend(requests)

    @property
    def held(self) -> int:
        """Requests held for adapters being loaded or compiled."""
        return len(self._held)

    def refuse_held(self, reason: str) -> None:
        """Every held request shed with `reason` (the daemon stops)."""
        held, self._held = self._held, []
        self.row_writer.refuse([(r, "shed", reason, "drain") for r in held])

    def shed_late(self) -> None:
        """Held requests past their deadline are shed."""
        now = time.time()
        late = [r for r in self._held if now > r.deadline]
        if late:
            self._held = [r for r in self._held if now <= r.deadline]
            self.row_writer.refuse([(r, "shed", f"adapter {r.adapter!r} was still loading at its deadline", "deadline")
                              for r in late])

    def _release_held(self, name: str, reply: dict) -> None:
        held = [r for r in self._held if r.adapter == name]
        if not held:
            return
        self._held = [r for r in self._held if r.adapter != name]
        if reply.get("ok"):
            self.scheduler.extend(held)
        else:
            self.row_writer.errors(held, f"adapter {name!r} failed to load: {reply.get('error')}")

    # ------------------------------------------------------------------ operations
    def apply_operations(self) -> None:
        """Compiles that finished release their adapters' requests; then every queued operation, in order; each
        gets its reply."""
        self._compiles_done()
        while True:
            try:
                op = self.operations.get_nowait()
            except queue.Empty:
                return
            try:
                op.reply = {"load": self._load, "unload": self._unload, "list": self._list}[op.op](op)
            except Exception as e:  # noqa: BLE001 - an operation must not take serving down
                log.exception("adapter %s of %r failed", op.op, op.name)
                op.reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
            finally:
                if op.op == "load":
                    self.loading.discard(op.name)
                    if op.name not in self.compiling:  # else its compile releases them
                        self._release_held(op.name, op.reply)
                op.done.set()

    def _compiles_done(self) -> None:
        """Adapters whose backend models finished compiling serve from now on; one whose compile failed is taken
        out again, its held requests answered with the reason."""
        for name, job in [(n, j) for n, j in self.compiling.items() if j.done()]:
            del self.compiling[name]
            problem = job.exception()
            if problem is None:
                log.info("adapter %s: compiled for the %s backend, serving", name, self.engine.backend_name)
                self._release_held(name, {"ok": True})
                continue
            log.error("adapter %s: compiling for the %s backend failed: %s", name, self.engine.backend_name, problem)
            if name in self.engine.slots:
                self._remove(name, f"adapter {name!r} failed to compile: {problem}")
            self.failed[name] = f"compile failed: {problem}"
            self._release_held(name, {"ok": False, "error": f"compile failed: {problem}"})

    def _slots_reply(self) -> dict:
        return {"used": len(self.engine.slots), "total": self.engine.max_slots}

    def _load(self, op: Operation) -> dict:
        name, adapter = op.name, op.adapter
        problem = self.engine.misfit(adapter)
        if problem:
            return {"ok": False, "error": f"adapter {name!r} does not fit this backbone: {problem}"}
        evicted = None
        if name not in self.engine.slots and not self.engine.free_slots():
            victims = [n for n in self.engine.slots if n not in self.pinned]
            if not victims:
                return {"ok": False, "error": f"no free slot for {name!r}: all {self.engine.max_slots} "
                                              f"(daemon.max_slots) hold pinned adapters ({', '.join(self.engine.slots)}); "
                                              f"unload one first"}
            evicted = min(victims, key=lambda n: self._last_used.get(n, 0.0))  # least recently used
            self.metrics.eviction()
            self._remove(evicted, f"adapter {evicted!r} was evicted (least recently used) to load {name!r}")
        reloaded = name in self.engine.slots
        target = self.engine.slots.get(name, (self.engine.free_slots() or [None])[0])
        if target is not None and self.engine.weights_slot == target:
            self.pristine_weights()
        slot = self.engine.load(name, adapter)
        self.failed.pop(name, None)
        if op.pin:
            self.pinned.add(name)
        self._last_used[name] = time.time()
        self._changed()
        job = self.engine.prepare(name)  # its backend models, compiled on their own thread (None: nothing to build)
        if job is not None:
            self.compiling[name] = job
        log.info("adapter %s %s into slot %d (%s, sha256 %s)%s%s", name, "reloaded" if reloaded else "loaded", slot,
                 adapter.path, adapter.sha256[:16], f"; evicted {evicted}" if evicted else "",
                 "; compiling, its requests wait" if job is not None else "")
        return {"ok": True, "name": name, "slot": slot, "reloaded": reloaded, "evicted": evicted,
                "sha256": adapter.sha256[:16], "slots": self._slots_reply(), "compiling": job is not None}

    def _unload(self, op: Operation) -> dict:
        if op.name not in self.engine.slots:
            return {"ok": False, "error": f"adapter {op.name!r} is not loaded (loaded: {', '.join(self.engine.slots) or 'none'})"}
        slot = self._remove(op.name, f"adapter {op.name!r} was unloaded")
        return {"ok": True, "name": op.name, "slot": slot, "slots": self._slots_reply()}

    def _list(self, op: Operation) -> dict:
        adapters = [{"name": n, "slot": s, "pinned": n in self.pinned, "size": self.engine.sizes[n],
                     "task": self.catalog.adapters[n].task, "sha256": a.sha256[:16], "path": str(a.path),
                     "last_used": self._last_used.get(n)}
                    for n, s in sorted(self.engine.slots.items(), key=lambda x: x[1]) for a in [self.engine.adapters[n]]]
        return {"ok": True, "adapters": adapters, "failed": dict(self.failed), "slots": self._slots_reply()}

    def _remove(self, name: str, reason: str) -> int:
        """Take an adapter out of its slot; its queued requests get error rows saying why."""
        if self.engine.weights_slot == self.engine.slots[name]:
            self.pristine_weights()
        slot = self.engine.unload(name)
        self.compiling.pop(name, None)  # a compile still running is for weights no longer there
        self.pinned.discard(name)
        self._last_used.pop(name, None)
        held = [r for r in self._held if r.adapter == name]  # held while it compiled: told too
        self._held = [r for r in self._held if r.adapter != name]
        self.row_writer.errors(self.scheduler.drop_adapter(name) + held, reason)
        self._changed()
        log.info("%s (slot %d freed)", reason, slot)
        return slot

    def pristine_weights(self) -> None:
        """The base weights back to holding no adapter (before their slot is rewritten, and after warm-up)."""
        self.engine.switch(self.catalog.resting_mode())
        self.scheduler.weights_now(self.engine.weights_slot)

    def _changed(self) -> None:
        self.metrics.slots_used.set(len(self.engine.slots))
        self.catalog = self.engine.catalog()
        self.scheduler.use_catalog(self.catalog)
        self.row_writer.adapters_changed()
