"""Logging set-up shared by every process: one line per event, tagged with the process role."""

from __future__ import annotations

import logging


def setup_logging(level: str = "INFO", role: str = "main") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)-7s [{role}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
