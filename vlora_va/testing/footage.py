"""Where the second real camera lies: ../shared/footage/traffic-a.mp4 (tests and development only, never shipped or
committed; its README says where it comes from). Looked for, in order: $VLORA_VA_FOOTAGE (a folder), the `shared/`
beside the checkout, and /work/shared (the workplace's machines mount it there)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAFFIC_A = "traffic-a.mp4"
TRAFFIC_A_SHA256 = "c67c50ba970fba19efc97b160467703f5a6e1afedf294c496ad2f188f49157e0"


def footage_dirs() -> list[Path]:
    env = os.environ.get("VLORA_VA_FOOTAGE")
    return [Path(p) for p in ([env] if env else [])] + [ROOT.parent / "shared" / "footage",
                                                         Path("/work/shared/footage")]


def second_camera() -> Path | None:
    """traffic-a.mp4 where one of footage_dirs() holds it, else None."""
    return next((d / TRAFFIC_A for d in footage_dirs() if (d / TRAFFIC_A).is_file()), None)
