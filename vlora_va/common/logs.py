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


THROTTLE_PERIOD_S = 10.0


class Throttle:
    """At most `burst` log lines of one kind per `period_s`; the rest are counted and said in one line when
    the period ends. A hostile sender's garbage must not turn into a log flood."""

    def __init__(self, logger: logging.Logger, what: str, burst: int = 10, period_s: float = THROTTLE_PERIOD_S):
        self.logger, self.what, self.burst, self.period_s = logger, what, burst, period_s
        self._start, self._count, self._suppressed = float("-inf"), 0, 0

    def error(self, now: float, msg: str, *args) -> None:
        if now - self._start >= self.period_s:
            if self._suppressed:
                self.logger.error("... and %d more %s in the last %.0f s", self._suppressed, self.what, self.period_s)
            self._start, self._count, self._suppressed = now, 0, 0
        if self._count < self.burst:
            self._count += 1
            self.logger.error(msg, *args)
        else:
            self._suppressed += 1
