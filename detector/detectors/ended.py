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
about one in 10^13. Saved as the two arrays' bytes (``k`` and ``t``); the map of run id to end
time saved before (up to 4c0bdb7) reads back as the same runs. The code before reads this shape as
no state (a rollback forgets which runs ended: a re-read end event within the horizon could count
again).
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

__all__ = ["SMALL", "Ended", "digest"]

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
_LITTLE = sys.byteorder == "little"


@lru_cache(maxsize=4096)
def digest(run_id: str) -> int:
    """``run_id``'s 64-bit digest (the three run rules ask for the same id one after another)."""
    return int.from_bytes(hashlib.blake2b(run_id.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def _to_bytes(values: array[Any]) -> bytes:
    if _LITTLE:
        return values.tobytes()
    swapped = array(values.typecode, values)
    swapped.byteswap()
    return swapped.tobytes()


def _from_bytes(typecode: str, data: bytes) -> array[Any]:
    values = array(typecode)
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values


class Ended:
    """Run id → end time, in the order the runs ended, held by the ids' digests (see the module)."""

    __slots__ = ("_keys", "_times", "_big")

    def __init__(self, runs: Mapping[str, float] | None = None) -> None:
        self._keys: Digests = _NO_KEYS
        self._times: Times = _NO_TIMES
        self._big: dict[int, float] | None = None
        if runs:
            self._set([(digest(k), v) for k, v in runs.items()])

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
        """``run_id`` ended at ``t``: the newest (a run already held keeps its place, as a dict's key)."""
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

    def saved(self) -> dict[str, bytes]:
        """The digests and the times, each as its array's bytes little-endian (16 bytes a run)."""
        if self._big is not None:
            keys, times = array("Q", self._big.keys()), array("d", self._big.values())
        else:
            keys, times = self._keys, self._times
        return {"k": _to_bytes(keys), "t": _to_bytes(times)}

    @classmethod
    def read_saved(cls, obj: Any) -> Ended:
        """What :meth:`saved` wrote, or the map of run id to end time saved before."""
        if isinstance(obj, dict) and set(obj) == {"k", "t"} and all(isinstance(v, bytes) for v in obj.values()):
            keys, times = obj["k"], obj["t"]
            if len(keys) % 8 or len(keys) != len(times):
                raise ValueError("ended runs are 8 bytes of digest and 8 of end time a run")
            digests = _from_bytes("Q", keys)
            if len(set(digests)) != len(digests):
                raise ValueError("ended runs hold a digest twice")
            ended = cls()
            ended._set(list(zip(digests, _from_bytes("d", times), strict=True)))
            return ended
        if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in obj.items()
        ):
            raise ValueError("ended runs are a map of run id to end time, or their digests and times")
        return cls({k: float(v) for k, v in obj.items()})
