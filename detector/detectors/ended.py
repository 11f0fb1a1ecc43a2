"""The runs of a project that have ended, and when: so a re-read event of one changes nothing.

``failed_run_spend``, ``plateaued_run`` and ``spot_eligible`` each remember them for a day or
two. As a dict, a run cost each rule a dict slot (~28 bytes) besides its id and a float object
(24): about 2.1 KB of a project's state after a day of the bench fleet's runs. :class:`Ended` holds
them as a tuple of ids and an ``array('d')`` of times in the order they ended (16 bytes a run a
rule); past :data:`SMALL` runs (a sweep ending thousands) it holds the dict again, so a look-up
never walks more than :data:`SMALL` ids. Either way it behaves as the ``dict[str, float]`` it
replaces (insertion order included) and is saved as that dict, byte for byte, so a snapshot saved
before reads back as it was and one saved now reads in the code before.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

__all__ = ["SMALL", "Ended"]

if TYPE_CHECKING:
    Times = array[float]
else:
    Times = array

SMALL = 128
"""Most runs held as a tuple and an array: a look-up walks at most this many ids (a few µs)."""

_NO_TIMES: Times = array("d")
"""No run ended (never appended to: a new ``Ended`` makes its own array at its first run)."""


class Ended:
    """Run id → end time, in the order the runs ended (what a dict held; see the module)."""

    __slots__ = ("_ids", "_times", "_big")

    def __init__(self, runs: Mapping[str, float] | None = None) -> None:
        self._ids: tuple[str, ...] = ()
        self._times: Times = _NO_TIMES
        self._big: dict[str, float] | None = None
        if runs:
            self._set(list(runs.items()))

    def _set(self, items: list[tuple[str, float]]) -> None:
        if len(items) > SMALL:
            self._ids, self._times, self._big = (), _NO_TIMES, dict(items)
        else:
            self._ids = tuple(k for k, _ in items)
            self._times = array("d", [v for _, v in items]) if items else _NO_TIMES
            self._big = None

    def items(self) -> list[tuple[str, float]]:
        if self._big is not None:
            return list(self._big.items())
        return list(zip(self._ids, self._times, strict=True))

    def get(self, run_id: str) -> float | None:
        if self._big is not None:
            return self._big.get(run_id)
        try:
            return self._times[self._ids.index(run_id)]
        except ValueError:
            return None

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._big if self._big is not None else run_id in self._ids

    def __len__(self) -> int:
        return len(self._big) if self._big is not None else len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._big) if self._big is not None else self._ids)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Ended) and self.items() == other.items()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dict was

    def __repr__(self) -> str:
        return f"Ended({dict(self.items())!r})"

    def add(self, run_id: str, t: float) -> None:
        """``run_id`` ended at ``t``: the newest (a run already held keeps its place, as a dict's key)."""
        if self._big is not None:
            self._big[run_id] = t
            return
        try:
            i = self._ids.index(run_id)
        except ValueError:
            if len(self._ids) >= SMALL:
                self._set([*self.items(), (run_id, t)])
                return
            self._ids += (run_id,)
            if self._times is _NO_TIMES:
                self._times = array("d")
            self._times.append(t)
            return
        self._times[i] = t

    def discard(self, run_id: str) -> None:
        """Forget ``run_id`` (its id used again, for a new run)."""
        if self._big is not None:
            self._big.pop(run_id, None)
            if len(self._big) <= SMALL:
                self._set(list(self._big.items()))
            return
        try:
            i = self._ids.index(run_id)
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

    # -- saved as the dict it replaces (detector.floats.enc_hook / dec_hook) ------------------

    def saved(self) -> dict[str, float]:
        return dict(self.items())

    @classmethod
    def read_saved(cls, obj: Any) -> Ended:
        if not isinstance(obj, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) for k, v in obj.items()
        ):
            raise ValueError("ended runs are a map of run id to end time")
        return cls({k: float(v) for k, v in obj.items()})
