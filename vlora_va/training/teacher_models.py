"""The teacher networks themselves: where their files are, how one is run, and how NanoDet's raw outputs
become boxes. Teachers (teachers.py) wrap these with caching, class filters and tiling.

A teacher file is OpenVINO IR (`NAME.xml` + `NAME.bin`, what `vlora-va teachers fetch` writes) or ONNX (a
user's own detector, or the development files); `find_model` prefers IR.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from vlora_va.training.teacher_fetch import teachers_dir

NANODET_SIZE = 416
NANODET_STRIDES = (8, 16, 32)
NANODET_BINS = 11  # distances are distributions over 0..10 strides (GFL head, reg_max 10)
# NanoDet's own preprocessing: BGR, minus ImageNet means, divided by their stds (0-255 scale)
NANODET_MEAN_BGR = np.array([103.53, 116.28, 123.675], np.float32)
NANODET_STD_BGR = np.array([57.375, 57.12, 58.395], np.float32)


class TeacherMissing(FileNotFoundError):
    """No file for a teacher; the message says how to get it."""


def find_model(name: str, folder: str | Path | None = None) -> Path:
    """`NAME.xml` (IR) or else `NAME.onnx` in `folder` (default: the fetched teachers)."""
    folder = Path(folder) if folder else teachers_dir()
    for ext in (".xml", ".onnx"):
        if (folder / f"{name}{ext}").is_file():
            return folder / f"{name}{ext}"
    raise TeacherMissing(f"teacher {name!r} not found in {folder} (no {name}.xml or {name}.onnx): run "
                         "`vlora-va teachers fetch`, or set teachers_dir in the spec")


def model_digest(path: Path) -> str:
    """12 hex digits naming the model's content (an IR's xml and bin both count): label caches key on it."""
    h = hashlib.sha256(path.read_bytes())
    if path.suffix == ".xml":
        h.update(path.with_suffix(".bin").read_bytes())
    return h.hexdigest()[:12]


class ModelRunner:
    """One teacher network on the CPU, fp32, `threads` threads; opened on first use (a worker process that never
    labels a frame never loads it). `run(x)` returns the outputs in the model's order."""

    def __init__(self, path: Path, threads: int = 1):
        self.path, self.threads = Path(path), threads
        self._run = None

    def _open(self):
        if self.path.suffix == ".xml":
            from vlora_va.engine.backends.openvino import import_openvino

            ov = import_openvino()
            # fp32: a teacher's boxes are labels; bf16 on a bf16 CPU would move them
            compiled = ov.Core().compile_model(str(self.path), "CPU", {
                "INFERENCE_NUM_THREADS": self.threads, "INFERENCE_PRECISION_HINT": "f32"})
            request = compiled.create_infer_request()

            def run(x):
                result = request.infer({0: x})  # once: every output comes from this one inference
                return [result[out] for out in compiled.outputs]

            return run
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        session = ort.InferenceSession(str(self.path), opts, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return lambda x: session.run(None, {name: x})

    def run(self, x: np.ndarray) -> list[np.ndarray]:
        if self._run is None:
            self._run = self._open()
        return self._run(x)


def nanodet_input(rgb: np.ndarray) -> np.ndarray:
    """[1, 3, 416, 416] float32 from an RGB frame (stretched to the square, as the detector was trained)."""
    import cv2

    x = cv2.resize(rgb, (NANODET_SIZE, NANODET_SIZE), interpolation=cv2.INTER_LINEAR)[..., ::-1].astype(np.float32)
    return np.ascontiguousarray(((x - NANODET_MEAN_BGR) / NANODET_STD_BGR).transpose(2, 0, 1)[None])


def decode_nanodet(outputs: list[np.ndarray], min_score: float) -> list[tuple[list[float], int, float]]:
    """[(box x1,y1,x2,y2 in 416-px input coordinates, class, score)] for every cell and class scoring >= min_score.

    Per level of stride s (grid n = 416 / s): a score map [n*n, 80] (sigmoid already applied) and a box map
    [n*n, 44] = 4 sides x 11 bins; each side's distance is the softmax-expectation over bins, times s, from the
    cell centre ((col + 0.5) s, (row + 0.5) s). Levels are told apart by their cell count."""
    by_shape = {tuple(o.shape): o for o in outputs}
    found = []
    for s in NANODET_STRIDES:
        n = NANODET_SIZE // s
        scores, dist = by_shape.get((1, n * n, 80)), by_shape.get((1, n * n, 4 * NANODET_BINS))
        if scores is None or dist is None:
            raise ValueError(f"NanoDet outputs {sorted(by_shape)} lack the stride-{s} level ({n * n} cells)")
        cells, classes = np.nonzero(scores[0] >= min_score)
        if not len(cells):
            continue
        logits = dist[0, cells].reshape(-1, 4, NANODET_BINS)
        p = np.exp(logits - logits.max(-1, keepdims=True))
        d = (p / p.sum(-1, keepdims=True) * np.arange(NANODET_BINS)).sum(-1) * s  # [k, 4]: left, top, right, bottom
        cx, cy = (cells % n + 0.5) * s, (cells // n + 0.5) * s
        boxes = np.stack([cx - d[:, 0], cy - d[:, 1], cx + d[:, 2], cy + d[:, 3]], 1)
        found += [(b, int(c), float(scores[0, i, c])) for b, i, c in zip(boxes.tolist(), cells, classes)]
    return found
