"""A frame's path through the daemon: which files one chunk's data is handed through, from the message read off
the socket until its rows are handed to the sinks, and which of them it enters more than once.

Method: a real daemon (tiny random-weight DINOv2, one detection and one action adapter, a JSON Lines sink) is started
in this process and sent ONE chunk (two frames; by default one task, detect) over a real ZeroMQ socket. Every Python
call in every thread is seen (threading.setprofile) until every row of the chunk has been handed to the sink's
`write`, and the sink has written them. The weight switch a plan's mode may need (Engine.switch: adapter weights,
never the chunk's data) is left out. A call is a hand-off when
  - it goes from a function in one of the project's files into a function in another (a comprehension or lambda
    belongs to the function it is written in; a call within one file is not a hand-off);
  - its caller is project code with no library frame above it up to the thread's first project frame (a project
    function that a library calls back, e.g. a LoRA layer called by the transformer's forward, is inside that
    library call, and so is all below it: the backbone forward is one step. torch's context-manager decorators
    are transparent);
  - one of its arguments, or its return value, holds the chunk's data: the message parts, a Chunk, Request,
    Received item, BatchPlan, frames (numpy arrays), a tensor, Features, a head's result or a ResultRecord (alone
    or in a list / tuple / dict). The data's own methods and constructors (`request.num_images`,
    `Features.from_hidden`) are not hand-offs: the data stays where it is.
A file is entered each time a hand-off passes the data INTO it (an argument) while it is not already on the call
stack; a call that only returns the data (the scheduler's next plan, the transport's next chunks) is the data leaving
that file. The path is the
files in the order the data first reached them (callers included); a file entered more than once is "entered twice".

    python bench/frame_path.py [--out bench/results/frame_path.json] [--calls]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Set below, once the imports have shown where the project's files are.
PROJECT_DIRS: tuple[str, ...] = ()
DATA_TYPES = {"Chunk", "ChunkHeader", "Request", "Received", "BatchPlan", "SizeGroup", "ndarray", "Tensor", "Features",
              "DetectionResult", "ActivityResult", "ResultRecord", "Frame", "bytes", "memoryview"}
TINY_IMAGE = 56
TRANSPARENT = ("torch/utils/_contextlib.py",)


def carries(value, depth: int = 0) -> bool:
    name = type(value).__name__
    if name in DATA_TYPES:
        return True
    if depth < 2 and isinstance(value, (list, tuple)) and value:
        return carries(value[0], depth + 1)
    if depth < 2 and isinstance(value, dict) and value:
        return carries(next(iter(value.values())), depth + 1)
    return False


def in_project(filename: str) -> bool:
    return filename.startswith(PROJECT_DIRS) and "/bench/" not in filename and "/tests/" not in filename


class Tracer:
    """Records the hand-offs (see the module docstring) of every thread."""

    def __init__(self, rows: int):
        # (time, thread, caller file, file, function, whether its arguments carried the data)
        self.calls: list[tuple[float, str, str, str, str, bool]] = []
        self._open: dict[int, tuple[float, str, str, str, bool, int]] = {}
        self.on = False
        self.rows, self.written = rows, 0  # rows the chunk gets; rows handed to the sink so far
        self.done_at: float | None = None  # when the last of them was

    def profile(self, frame, event, arg):
        if not self.on:
            return
        if event == "call":
            code = frame.f_code
            if code.co_name.startswith("<") or not in_project(code.co_filename):
                return  # a comprehension or lambda is part of the function it is written in
            caller = self._caller(frame)
            if caller is None or caller == code.co_filename or self._on_stack(frame, code.co_filename):
                return
            if self._in_weight_switch(frame):
                return
            args = [frame.f_locals.get(n) for n in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]]
            if args and code.co_varnames[0] in ("self", "cls"):
                owner = args.pop(0)
                if (owner if isinstance(owner, type) else type(owner)).__name__ in DATA_TYPES:
                    return  # the data's own method or constructor: the data stays where it is
            rows = len(args[0]) if code.co_name == "write" and "sink" in code.co_filename and args else 0
            self._open[id(frame)] = (time.perf_counter(), caller, code.co_filename, code.co_name,
                                     any(map(carries, args)), rows)
        elif event == "return":
            rec = self._open.pop(id(frame), None)
            if rec is None or (self.done_at is not None and rec[0] > self.done_at):
                return
            if rec[4] or carries(arg):
                self.calls.append((rec[0], threading.current_thread().name, *rec[1:5]))
            self.written += rec[5]
            if rec[5] and self.written >= self.rows and self.done_at is None:
                self.done_at = time.perf_counter()  # every row was handed to the sink: the end of the path

    @staticmethod
    def _in_weight_switch(frame) -> bool:
        """Inside Engine.switch: the one-shot weight switch a plan's mode may need before its forward computes
        with adapter weights, never with the chunk's data."""
        back = frame.f_back
        while back is not None:
            if back.f_code.co_name == "switch" and back.f_code.co_filename.endswith("executor.py"):
                return True
            back = back.f_back
        return False

    @staticmethod
    def _caller(frame) -> str | None:
        """The file of the project function that called this one; None when a library called it, or when a library
        call of project code lies further up (then this is inside that library call). A context-manager decorator
        (torch.inference_mode) is transparent."""
        back, caller, seen_library = frame.f_back, None, False
        while back is not None:
            f = back.f_code.co_filename
            if f.endswith(TRANSPARENT):
                pass
            elif in_project(f):
                if seen_library:
                    return None
                caller = caller or f
            elif caller is None:
                return None  # called by a library
            else:
                seen_library = True
            back = back.f_back
        return caller

    @staticmethod
    def _on_stack(frame, filename: str) -> bool:
        back = frame.f_back
        while back is not None:
            if back.f_code.co_filename == filename:
                return True
            back = back.f_back
        return False


def tiny_setup(tmp: Path):
    from vlora_va.testing.tiny import make_adapters, make_backbone

    return make_backbone(tmp / "backbone"), make_adapters(tmp)


def main(argv=None) -> int:
    global PROJECT_DIRS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="write the path here as JSON")
    ap.add_argument("--calls", action="store_true", help="print every hand-off, not only the files")
    ap.add_argument("--tasks", default="detect", help="the chunk's tasks: detect and/or activity (comma-separated)")
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",")

    import numpy as np
    import zmq

    import vlora_va
    from vlora_va.contracts.config import parse_config
    from vlora_va.contracts.geometry import Letterbox
    from vlora_va.contracts.wire import ChunkHeader, TaskRequest, encode_chunk
    from vlora_va.outputs.attach import run_with_outputs
    from vlora_va.serving.daemon import Daemon

    PROJECT_DIRS = tuple({str(Path(vlora_va.__file__).parent), str(ROOT / "streams"), str(ROOT / "kernels")})

    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        backbone, adapters = tiny_setup(tmp)
        cfg = parse_config(f"""
daemon: {{endpoint: "ipc://{tmp}/d.sock", backbone: "{backbone}", image_size: {TINY_IMAGE}, threads: 1,
          max_wait_ms: 5, profile_cache: "{tmp}/profiles", precision: fp32}}
adapters: {{detect: "{adapters['detect']}", actions: "{adapters['actions']}"}}
streams: [{{id: cam, source: unused.mp4, tasks: [{{adapter: detect}}]}}]
sinks: [{{type: jsonl, path: "{tmp}/rows.jsonl", fsync: never}}]
""", "frame_path.yaml", tmp)
        daemon = Daemon(cfg)
        tracer = Tracer(len(tasks))
        threading.setprofile(tracer.profile)
        stop, ready, drained = threading.Event(), threading.Event(), threading.Event()
        thread = threading.Thread(target=run_with_outputs, args=(daemon, stop, ready, drained), name="daemon")
        thread.start()
        assert ready.wait(120), "the daemon did not start"
        rng = np.random.default_rng(0)
        frames = [rng.integers(0, 255, (TINY_IMAGE, TINY_IMAGE, 3), dtype=np.uint8) for _ in range(2)]
        now = time.time()
        header = ChunkHeader(stream="cam", seq=0, fps=10.0, frame_ts=(0.0, 0.1), frame_shape=(TINY_IMAGE, TINY_IMAGE, 3),
                             orig_size=(TINY_IMAGE, TINY_IMAGE), letterbox=Letterbox(1.0, 0.0, 0.0),
                             tasks=tuple(TaskRequest(t, {"detect": "detect", "activity": "actions"}[t], (0, 1), 30000.0)
                                         for t in tasks),
                             ready_wall=now, sent_wall=now)
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(cfg.daemon.endpoint)
        tracer.on = True
        push.send_multipart(encode_chunk(header, frames))
        rows = tmp / "rows.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not rows.exists() or len(rows.read_text().splitlines()) < len(tasks)):
            time.sleep(0.01)
        tracer.on = False
        threading.setprofile(None)
        stop.set()
        thread.join(120)
        push.close(linger=0)
        ctx.term()
        assert len(rows.read_text().splitlines()) == len(tasks), "the rows were not written"

    def rel(f: str) -> str:
        for d in PROJECT_DIRS:
            if f.startswith(d):
                return (Path(d).name + f[len(d):]) if Path(d).name != "vlora_va" else "vlora_va" + f[len(d):]
        return f

    calls = sorted(tracer.calls)
    files: list[str] = []  # in the order the data first entered them
    entered: dict[str, int] = {}
    for _, _, caller, f, _, handed in calls:
        for name in (rel(caller), rel(f)):
            if name not in files:
                files.append(name)
        if handed:  # the data entered f (a call that only returns it is the data leaving f)
            entered[rel(f)] = entered.get(rel(f), 0) + 1
    result = {"tasks": tasks, "files": len(files), "hand_offs": len(calls), "path": files,
              "entered": entered, "entered_twice": {f: n for f, n in entered.items() if n > 1}}
    if args.calls:
        for t0, thread_name, caller, f, fn, handed in calls:
            print(f"{t0:.6f} {thread_name[:14]:>14} {rel(caller)} {'->' if handed else '<-'} {rel(f)}:{fn}")
    print(" -> ".join(files))
    print(f"{result['files']} files, {result['hand_offs']} hand-offs; entered more than once: "
          f"{result['entered_twice'] or 'none'}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
