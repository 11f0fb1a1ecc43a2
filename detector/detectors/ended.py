"""The runs of a project that have ended, and when: so a re-read event of one changes nothing.

``failed_run_spend``, ``plateaued_run`` and ``spot_eligible`` each remember them for a day or
two, only to answer "has this run ended, and when": the id itself is never read back. So a run is
held as a 64-bit digest of its id (BLAKE2b, the same in every process, unlike ``hash()``) in an
``array('Q')`` beside an ``array('d')`` of end times, in the order the runs ended: 16 bytes a run a
rule. A dict of ids cost a slot, the id string and a float object (~110 bytes a run); the tuple of
ids that replaced it still held the strings (~60 bytes each, and three rules held them twice): 2.5 KB
of a project's state after the bench fleet's day. Past :data:`SMALL` runs (a sweep ending
thousands) it holds a dict of digest to time, so a look-up never walks more than :data:`SMALL`.

Two ids with the same digest would read as one run: for a project's thousand ids the chance is
about one in 10^13. Saved as a map of ``#`` and each digest's 16 hex digits to the end time: the code
before (up to 4c0bdb7) reads it as ended runs whose ids no run has, so a rollback keeps the rules'
other state (open runs, a crash loop) and forgets only which runs ended; the map of run ids it
saved reads back here as the same runs. (An id of that very form, ``#`` and 16 hex digits, saved
before is read as a digest: its end would be forgotten.)
"""

from __future__ import annotations

import hashlib
import math
import re
from array import array
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

__all__ = ["SMALL", "STRAGGLER_S", "Ended", "digest", "is_past"]

if TYPE_CHECKING:
    Digests = array[int]
    Times = array[float]
else:
    Digests = Times = array

SMALL = 128
"""Most runs held as two arrays: a look-up walks at most this many digests (a few µs)."""

_NO_KEYS: Digests = array("Q")
_NO_TIMES: Times = array("d")
"""No run ended (never appended to: a new ``Ended`` makes its own arrays at its first run)."""
_SAVED = re.compile(r"#[0-9a-f]{16}")
"""A saved run: its digest in hex (:meth:`Ended.saved`)."""


STRAGGLER_S = 300.0
"""How long after a run's end an event of its id other than ``started`` is the run's straggler (a heartbeat
thread's last beat sent after the end was, or stamped by a clock a little ahead), not a new attempt: five
minutes, more than the heartbeat intervals run trackers use (30-60 s)."""


def is_past(ended_at: float | None, status: str, t: float, running: bool = False) -> bool:
    """Whether an event of an ended run's id at ``t`` belongs to that run and changes nothing: a re-read
    (dated up to its end), or a straggler (:data:`STRAGGLER_S`). Else the id is used again, a new run: a
    Job or task retried by its controller under its own name (its ``started``), a scheduled job's fixed
    name. ``running``: a run of the id is open again (a retry's ``started`` came after the end): an event
    past the end is that attempt's, not a straggler, however soon (a crash loop retrying within seconds
    ends each attempt with its own ``failed``). Before 2026-12-07 every later event was the old run's (a
    retried Job's crash loop went unseen); then for a while any later one was a new run, a straggling
    heartbeat too (a run that never ends)."""
    if ended_at is None or t <= ended_at:
        return ended_at is not None
    return not running and status != "started" and t - ended_at <= STRAGGLER_S


@lru_cache(maxsize=4096)
def digest(run_id: str) -> int:
    """``run_id``'s 64-bit digest (the three run rules ask for the same id one after another)."""
    return int.from_bytes(hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


class Ended:
    """Run id → end time, in the order the runs ended, held by the ids' digests (see the module)."""

    __slots__ = ("_keys", "_times", "_big")

    def __init__(self, runs: Mapping[str, float] | None = None) -> None:
        self._keys: Digests = _NO_KEYS
        self._times: Times = _NO_TIMES
        self._big: dict[int, float] | None = None
        if runs:
            self._set(list({digest(k): v for k, v in runs.items()}.items()))

    def _set(self, items: list[tuple[int, float]]) -> None:
        if len(items) > SMALL:
            self._keys, self._times, self._big = _NO_KEYS, _NO_TIMES, dict(items)
        elif items:
            self._keys = array("Q", [k for k, _ in items])
            self._times = array("d", [v for _, v in items])
            self._big = None
        else:
            self._keys, self._times, self._big = _NO_KEYS, _NO_TIMES, None

    def items(self) -> list[tuple[int, float]]:
        """(digest, end time) of each run, in the order they ended."""
        if self._big is not None:
            return list(self._big.items())
        return list(zip(self._keys, self._times, strict=True))

    def get(self, run_id: str) -> float | None:
        key = digest(run_id)
        if self._big is not None:
            return self._big.get(key)
        try:
            return self._times[self._keys.index(key)]
        except ValueError:
            return None

    def __contains__(self, run_id: str) -> bool:
        key = digest(run_id)
        return key in self._big if self._big is not None else key in self._keys

    def __len__(self) -> int:
        return len(self._big) if self._big is not None else len(self._keys)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ended) and self.items() == other.items()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dict was

    def __repr__(self) -> str:
        return f"Ended({self.items()!r})"

    def add(self, run_id: str, t: float) -> None:
        """``run_id`` ended at ``t``: the newest (a run already held keeps its place, as a dict's key).
        A time that is not finite is refused here, as :meth:`read_saved` refuses it: held, it would
        make the whole rule state unreadable at its restore, not only this run."""
        if not math.isfinite(t):
            raise ValueError(f"run {run_id[:200]!r} ended at {t!r}: not a time")
        key = digest(run_id)
        if self._big is not None:
            self._big[key] = t
            return
        try:
            i = self._keys.index(key)
        except ValueError:
            if len(self._keys) >= SMALL:
                self._set([*self.items(), (key, t)])
                return
            if self._keys is _NO_KEYS:
                self._keys, self._times = array("Q"), array("d")
            self._keys.append(key)
            self._times.append(t)
            return
        self._times[i] = t

    def discard(self, run_id: str) -> None:
        """Forget ``run_id`` (its id used again, for a new run)."""
        key = digest(run_id)
        if self._big is not None:
            self._big.pop(key, None)
            if len(self._big) <= SMALL:
                self._set(list(self._big.items()))
            return
        try:
            i = self._keys.index(key)
        except ValueError:
            return
        self._set([kv for j, kv in enumerate(self.items()) if j != i])

    def keep_since(self, horizon: float, newest: int | None = None) -> None:
        """Forget the runs that ended before ``horizon``; then, with ``newest``, all but that many of the
        latest to end (by the order they ended)."""
        kept = [(k, v) for k, v in self.items() if v >= horizon]
        if newest is not None:
            kept = kept[-newest:] if newest > 0 else []
        if len(kept) != len(self):
            self._set(kept)

    # -- saved (detector.floats.enc_hook / dec_hook) --------------------------------------------

    def saved(self) -> dict[str, float]:
        """Each run as ``#`` and its digest's 16 hex digits → its end time, in the order they ended."""
        return {f"#{key:016x}": t for key, t in self.items()}

    @classmethod
    def read_saved(cls, obj: Any) -> Ended:
        """What :meth:`saved` wrote, or the map of run id to end time saved before."""
        if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for k, v in obj.items()
        ):
            raise ValueError("ended runs are a map of run (its id, or its digest in hex) to a finite end time")
        runs: dict[int, float] = {}
        for k, v in obj.items():
            runs[int(k[1:], 16) if _SAVED.fullmatch(k) else digest(k)] = float(v)
        ended = cls()
        ended._set(list(runs.items()))
        return ended
