"""The letterbox: how an original camera frame is placed into the model's square input, and back.

Ingest letterboxes frames to the daemon's `image_size`; the daemon may resize them again to an adapter's own
size; heads map boxes back to original pixels. All of that is this one mapping: model = orig * scale + pad.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Letterbox:
    """How original frame pixels map into the model frame: model = orig * scale + pad."""

    scale: float
    pad_x: float
    pad_y: float

    def to_original(self, x: float, y: float) -> tuple[float, float]:
        return (x - self.pad_x) / self.scale, (y - self.pad_y) / self.scale

    def box_to_model(self, box) -> list[float]:
        """An x1, y1, x2, y2 box in original pixels -> model pixels (not clamped)."""
        return [box[0] * self.scale + self.pad_x, box[1] * self.scale + self.pad_y,
                box[2] * self.scale + self.pad_x, box[3] * self.scale + self.pad_y]

    def box_to_original(self, box: tuple[float, float, float, float], orig_size: tuple[int, int]) -> list[float]:
        """An x1, y1, x2, y2 box in model pixels -> original pixels, clamped to the frame (width, height)."""
        w, h = orig_size
        x1, y1 = self.to_original(box[0], box[1])
        x2, y2 = self.to_original(box[2], box[3])
        return [min(max(x1, 0.0), float(w)), min(max(y1, 0.0), float(h)), min(max(x2, 0.0), float(w)),
                min(max(y2, 0.0), float(h))]

    def resized(self, factor: float) -> "Letterbox":
        """The letterbox of a model frame that was resized by `factor` after letterboxing."""
        return self if factor == 1.0 else Letterbox(self.scale * factor, self.pad_x * factor, self.pad_y * factor)


def letterbox_geometry(width: int, height: int, size: int) -> tuple[int, int, Letterbox]:
    """Resized width and height and the mapping for an aspect-preserving fit into a size x size square,
    centred (padding split evenly, the odd pixel at the bottom/right)."""
    if width <= 0 or height <= 0 or size <= 0:
        raise ValueError(f"letterbox of a {width}x{height} frame into {size} px: sides must be positive")
    scale = min(size / width, size / height)
    new_w = max(1, min(size, round(width * scale)))
    new_h = max(1, min(size, round(height * scale)))
    return new_w, new_h, Letterbox(scale=scale, pad_x=float((size - new_w) // 2), pad_y=float((size - new_h) // 2))

