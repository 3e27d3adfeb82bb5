"""pipelines.yaml read as YAML that keeps its line numbers: the data, and the 1-based line of every key path in it
("streams[1].tasks[0].adapter" -> 19), so a problem found later names the line it is on."""

from __future__ import annotations

from typing import Any

import yaml

from vlora_va.contracts.config_checker import ConfigError


def _line_index(node: yaml.Node, path: str, out: dict[str, int]) -> None:
    """Record the 1-based line of every key path in a composed YAML node tree."""
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = f"{path}.{key.value}" if path else str(key.value)
            out[child] = key.start_mark.line + 1
            _line_index(value, child, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, f"{path}[{i}]", out)


def parse_yaml(text: str, file: str | None) -> tuple[Any, dict[str, int]]:
    """(the data, key path -> line); invalid YAML raises a ConfigError at the line where it breaks."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError("", f"invalid YAML: {problem}", line, file) from None
    lines: dict[str, int] = {}
    if node is not None:
        _line_index(node, "", lines)
    return data, lines
