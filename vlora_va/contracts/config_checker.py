"""How pipelines.yaml is checked: `ConfigError`, one error naming every problem of a file (each with its key path
and line), and `Checker`, which reads typed values out of the parsed YAML and collects those problems instead of
stopping at the first. Every section's parser (config.py, scene.py, sinks.py, cluster.py, ...) reads through one
Checker, so the whole file is reported at once, in file order.
"""

from __future__ import annotations

import math
import re
from typing import Any


class ConfigError(ValueError):
    """A configuration problem, located by key path (and line where known); `errors` holds every problem of the
    file, this one first. str() of several is one line per problem, in file order; key_path / line / file are
    the first problem's."""

    def __init__(self, path: str, message: str, line: int | None = None, file: str | None = None):
        self.key_path, self.line, self.file, self.message = path, line, file, message
        self.errors: list[ConfigError] = [self]
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else (f"line {line}: " if line else ""))
        super().__init__(f"{where}{path}: {message}" if path else f"{where}{message}")

    def __str__(self) -> str:
        return "\n".join(ValueError.__str__(e) for e in self.errors)

    @classmethod
    def of(cls, errors: list[ConfigError]) -> ConfigError:
        """One error carrying all of `errors`, sorted by line (unlocated ones last, in the order found)."""
        errors = sorted(errors, key=lambda e: (e.line is None, e.line or 0))
        first = errors[0]
        combined = cls(first.key_path, first.message, first.line, first.file) if len(errors) > 1 else first
        combined.errors = errors
        return combined


class Checker:
    """Reads typed values out of plain dicts and collects every problem (key path + line) instead of stopping at
    the first: a bad value reads as its default (None for a required key), so checking goes on without reporting
    what only follows from a problem already reported. `raise_if_any` ends the parse with all of them."""

    def __init__(self, lines: dict[str, int], file: str | None):
        self.lines, self.file = lines, file
        self.errors: list[ConfigError] = []

    def error(self, path: str, message: str) -> None:
        """Record a problem at path, with the line of the nearest key that has one."""
        line, probe = None, path
        while line is None and probe:
            line = self.lines.get(probe)
            parent = re.sub(r"(^|\.)[^.\[\]]+$|\[\d+\]$", "", probe)  # a.b[2].c -> a.b[2] -> a.b -> a -> ""
            probe = parent if parent != probe else ""
        self.errors.append(ConfigError(path, message, line, self.file))

    def failed(self, path: str) -> bool:
        """Whether a problem was recorded at path or inside it."""
        return any(e.key_path == path or e.key_path.startswith((f"{path}.", f"{path}[")) for e in self.errors)

    def unique(self, items: list, key: str, path: str, what: str) -> None:
        """Report every item (None: already reported) whose `key` attribute an earlier item has: `what` names it."""
        first: dict[Any, int] = {}
        for i, item in enumerate(items):
            if item is None:
                continue
            value = getattr(item, key)
            if value in first:
                self.error(f"{path}[{i}].{key}", f"duplicate {what} {value!r} (also {path}[{first[value]}])")
            else:
                first[value] = i

    def raise_if_any(self) -> None:
        if self.errors:
            raise ConfigError.of(self.errors)

    def mapping(self, value: Any, path: str, allowed: set[str]) -> dict | None:
        """The allowed keys of a mapping ({} for an empty value); None when it is not a mapping. Unknown keys are
        reported and left out."""
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.error(path, f"expected a mapping, got {type(value).__name__}")
            return None
        for key in value:
            if key not in allowed:
                self.error(f"{path}.{key}" if path else str(key),
                           f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return {k: v for k, v in value.items() if k in allowed}

    def get(self, d: dict, key: str, path: str, kind: type | tuple, default: Any = ..., *,
            minimum: float | None = None, choices: tuple | None = None) -> Any:
        """d[key] checked; missing: the default (a required key, default ...: reported, None). A bad value is
        reported and reads as the default (None for a required key)."""
        p = f"{path}.{key}" if path else key
        if key not in d or d[key] is None:
            if default is ...:
                self.error(p, "required key is missing")
                return None
            return default
        v, problem = self._read(d[key], kind, minimum, choices)
        if problem:
            self.error(p, problem)
            return None if default is ... else default
        return v

    @staticmethod
    def _read(v: Any, kind: type | tuple, minimum: float | None, choices: tuple | None) -> tuple[Any, str | None]:
        """(the value, an int read as a float where a float is asked; what is wrong with it, or None)."""
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds and isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > 1e15:  # float() of a huge int overflows; no setting here needs such a number
                return v, f"must be a number below 1e15, got an integer of {len(str(abs(v)))} digits"
            v = float(v)
        if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
            names = "/".join(k.__name__ for k in kinds)
            return v, f"expected {names}, got {type(v).__name__} {repr(v)[:40]}"
        if isinstance(v, float) and not math.isfinite(v):
            return v, f"must be a finite number, got {v}"
        if minimum is not None and v < minimum:
            return v, f"must be >= {minimum}, got {v}"
        if choices is not None and v not in choices:
            return v, f"must be one of {', '.join(choices)}, got {v!r}"
        return v, None
