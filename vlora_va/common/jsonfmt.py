"""Strict JSON for files other programs read: NaN/inf (an undefined metric) become null, never `NaN`."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(obj: Any) -> Any:
    """obj with every non-finite float replaced by None, recursively."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, **kw) -> str:
    return json.dumps(finite(obj), allow_nan=False, **kw)
