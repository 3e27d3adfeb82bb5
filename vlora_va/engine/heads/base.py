"""The head plug-in point: what every vision task head is, and how one is built from its adapter's head_config.json.

A head turns the backbone features of a batch's frames into each request's typed result (a payload with
`to_json()`, e.g. `contracts.results.DetectionResult`). Heads are registered by task name in
`contracts.plugins.HEADS` ("detection", "action"; a plug-in adds its own), and an adapter's head_config.json names
its task. A new head is one file: a `Head` subclass with `task`, `from_config` and `serve`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import nn

from vlora_va.contracts.geometry import Letterbox
from vlora_va.contracts.plugins import HEADS
from vlora_va.engine.heads.features import Features

HEAD_FORMAT = "vlora-va-head"
HEAD_FORMAT_VERSION = 1


@dataclass(frozen=True)
class Clip:
    """One request's frames as a head sees them: how many (consecutive rows of the features), how a model-size
    frame maps to the original one (at the size the adapter runs at), the original size and the frame times; and
    whether its result should carry appearance embeddings (a tracked task's; a head that makes none ignores it)."""

    frames: int
    letterbox: Letterbox
    orig_size: tuple[int, int]
    frame_ts: tuple[float, ...]
    embed: bool = False


class Head(nn.Module):
    """A vision task head (an nn.Module saved beside its adapter as head.safetensors)."""

    task: ClassVar[str]  # its name in contracts.plugins.HEADS and in head_config.json "task"
    # True: a request's frames form one input (a clip) and get one result; False: every frame is an input.
    clips: ClassVar[bool] = False
    detail: int = 0  # channels of a branch on the model input itself (0: the head reads no pixels)

    @classmethod
    def from_config(cls, config: dict, hidden: int) -> "Head":
        """The head head_config.json describes (its weights are loaded afterwards), on a backbone of width hidden."""
        raise NotImplementedError

    def min_frames(self, config: dict) -> int:
        """The fewest frames per request it accepts (overload may thin clips down to this)."""
        return 1

    def serve(self, feats: Features, clips: list[Clip], forward=None) -> list[Any]:
        """Each request's result, in order. feats holds the requests' frames, clip after clip. forward: this head's
        forward as a backbone backend compiled it (called as the module is; None: the module itself). The engine
        passes it only when a backend compiled the head, so a plug-in head may take (feats, clips) alone."""
        raise NotImplementedError


def build_head(config: dict, hidden: int) -> Head:
    """The head of head_config.json `config` (HEADS by its "task"); ValueError names an unknown task."""
    task = config.get("task")
    problem = HEADS.unknown(task)
    if problem:
        raise ValueError(f"head_config.json: {problem}")
    return HEADS.load(task).from_config(config, hidden)
