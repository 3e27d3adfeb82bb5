"""Where a stream stands, kept by a supervisor across restarts of its ingest worker.

A worker started on a position that has chunks continues the stream like a camera that reconnected: chunk numbers
go on from `next_seq`, media time goes on from `media_end` with the time the stream was down as an outage
(`outage_s` of the first chunk), and the chunks the previous worker made but never sent show as `dropped_before`.
A stream that ended is not started again.

The values live in a shared array of floats (`StreamPosition.shared(ctx)`: a multiprocessing array, which the
supervisor hands to each new worker process it spawns; `StreamPosition()` keeps them in a plain list, within one
process). Named fields over positions: a reader never has to know which index is which.
"""

from __future__ import annotations

_NEXT_SEQ, _LAST_SENT, _MEDIA_END, _LAST_WALL, _ENDED = range(5)
_START = (0.0, -1.0, 0.0, 0.0, 0.0)


class StreamPosition:
    __slots__ = ("_values",)

    def __init__(self, values=None):
        self._values = list(_START) if values is None else values

    @classmethod
    def shared(cls, ctx) -> "StreamPosition":
        """A position in shared memory (ctx: a multiprocessing context), for worker processes to continue."""
        return cls(ctx.Array("d", _START, lock=False))

    def values(self) -> list[float]:
        """The fields as a plain list (what `StreamPosition(values)` takes back, in another process)."""
        return list(self._values)

    @property
    def started(self) -> bool:
        """A previous worker made chunks of this stream."""
        return self._values[_NEXT_SEQ] > 0

    @property
    def next_seq(self) -> int:
        """The next chunk's number."""
        return int(self._values[_NEXT_SEQ])

    @property
    def last_sent(self) -> int:
        """The number of the last chunk handed to ZeroMQ (-1: none)."""
        return int(self._values[_LAST_SENT])

    @last_sent.setter
    def last_sent(self, seq: int) -> None:
        self._values[_LAST_SENT] = seq

    @property
    def media_end(self) -> float:
        """Media time just after the last chunk's last frame."""
        return self._values[_MEDIA_END]

    @property
    def last_wall(self) -> float:
        """Wall time of the last chunk's last frame."""
        return self._values[_LAST_WALL]

    @property
    def ended(self) -> bool:
        """The stream ended by itself (end of file, max_chunks): a restarted worker leaves it alone."""
        return self._values[_ENDED] > 0

    @ended.setter
    def ended(self, value: bool) -> None:
        self._values[_ENDED] = 1.0 if value else 0.0

    def skip(self, n: int) -> None:
        """Leave out the next `n` chunk numbers: ones a lost worker may have used after this position was read (a
        number used twice would make the second chunk's row a duplicate the cluster's collector drops)."""
        self._values[_NEXT_SEQ] += n

    def made(self, next_seq: int, media_end: float, last_wall: float) -> None:
        """A chunk was made: the next one is `next_seq`; its last frame ended at `media_end`, at `last_wall`."""
        self._values[_NEXT_SEQ], self._values[_MEDIA_END], self._values[_LAST_WALL] = next_seq, media_end, last_wall
