"""Detector state: each key's snapshot, saved with the write that stored its events, so a
restarted or newly assigned worker resumes where the last one stopped (docs/reliability.md)."""

from __future__ import annotations

import bisect
import time
from array import array
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from detector.store.connection import Connection

__all__ = ["SavedTimes", "States"]

_STATE_COLS = ["key", "partition", "snapshot", "deleted", "version", "last_t", "maybe_open"]
GET_MANY_CHUNK = 10_000
"""Keys per query of :meth:`States.get_many`: a few hundred kB of query text for ids of tens of
characters (10 MB at most: ids are at most 1,024 characters)."""


class States:
    """The ``detector_state`` table: the newest version of a key wins; a tombstone deletes it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def save(self, states: Sequence[tuple[str, int, bytes] | tuple[str, int, bytes, float]
                                    | tuple[str, int, bytes, float, bool]], version: int) -> None:  # fmt: skip
        """Write (key, partition, snapshot[, latest event time[, may hold an open episode]]) rows; the
        newest version of a key wins. The time (0 when not given: unknown) and the flag (true when not
        given: not known) are what :meth:`load` tells of each key."""
        if not states:
            return
        cols: list[list[Any]] = [[s[0] for s in states], [s[1] for s in states], [s[2] for s in states],
                [0] * len(states), [version] * len(states), [s[3] if len(s) > 3 else 0.0 for s in states],
                [int(s[4]) if len(s) > 4 else 1 for s in states]]  # fmt: skip
        self.conn.insert("detector_state", cols, column_names=_STATE_COLS, column_oriented=True)

    def load(self, partitions: Sequence[int], saved_within_s: float | None = None,
             latest: dict[str, float] | None = None, maybe_open: set[str] | None = None) -> dict[str, bytes | None]:
        """Every live key on these partitions → its latest snapshot; with ``saved_within_s``, only
        the keys saved within that many seconds of the partitions' newest save (a save's version
        is its wall-clock time) come with their snapshot, the rest with None, to be read one by
        one (:meth:`get`) if they speak again: a worker taking over a million keys, most of them
        quiet, does not hold every one's bytes until it speaks (docs/performance-log.md, "Memory per resource").
        From the newest save, not from now: after an outage longer than the horizon the keys
        that were live still come with their bytes, and catching up reads none of them one by one.
        ``latest`` is given each key's latest event time, where its state was saved with one
        (:meth:`save`): what the worker's sweeps reclaim the keys that never speak again by;
        ``maybe_open`` the keys whose state may hold an open episode, whose snapshots a sweep that
        reclaims them reads to resolve it."""
        if not partitions:
            return {}
        within_ns = -1 if saved_within_s is None else int(saved_within_s * 1e9)
        db = self.conn.db
        with self.conn.lock:
            result = self.conn.client.query(
                f"WITH (SELECT max(version) FROM {db}.detector_state WHERE partition IN %(partitions)s) AS newest "
                f"SELECT key, (%(within)s < 0 OR version + %(within)s >= newest) AS recent, "
                f"if(recent, snapshot, '') AS snapshot, last_t, maybe_open FROM {db}.detector_state FINAL "
                "WHERE partition IN %(partitions)s AND deleted = 0",
                parameters={"partitions": list(partitions), "within": within_ns},
                column_formats={"snapshot": "bytes"},
            )
        rows = result.result_rows
        if latest is not None:
            latest.update((key, last_t) for key, _, _, last_t, _ in rows if last_t > 0)
        if maybe_open is not None:
            maybe_open.update(key for key, _, _, _, flag in rows if flag)
        return {key: (snapshot if recent else None) for key, recent, snapshot, _, _ in rows}

    def take(self, loaded: dict[str, bytes | None], key: str) -> bytes | None:
        """A key's snapshot the first time it speaks after :meth:`load`: taken out of ``loaded``
        (memory held once), or read now if it was loaded without its bytes; None if not loaded."""
        if key not in loaded:
            return None
        data = loaded.pop(key)
        return data if data is not None else self.get(key)

    @staticmethod
    def unread(loaded: dict[str, bytes | None], keys: Iterable[str]) -> list[str]:
        """The keys among ``keys`` loaded without their bytes (:meth:`load`): what :meth:`take`
        would read one by one, for the worker to read together first (:meth:`get_many`)."""
        return [key for key in keys if key in loaded and loaded[key] is None]

    @staticmethod
    def fill(loaded: dict[str, bytes | None], keys: Iterable[str], found: dict[str, bytes]) -> None:
        """Put into ``loaded`` the bytes read for these keys (:meth:`unread`, :meth:`get_many`); a
        key the store no longer has (deleted meanwhile) leaves ``loaded``, as :meth:`take` would
        have found it gone."""
        for key in keys:
            data = found.get(key)
            if data is None:
                loaded.pop(key, None)
            elif key in loaded:
                loaded[key] = data

    def get(self, key: str) -> bytes | None:
        """The latest snapshot of one key, or None (never saved, or deleted): how a key the engine
        evicted comes back when it speaks again (one look-up by the table's sort key)."""
        with self.conn.lock:
            result = self.conn.client.query(
                f"SELECT argMax(snapshot, version) AS snapshot, argMax(deleted, version) AS deleted, count() AS n "
                f"FROM {self.conn.db}.detector_state WHERE key = %(key)s",
                parameters={"key": key},
                column_formats={"snapshot": "bytes"},
            )
        snapshot, deleted, n = result.result_rows[0]
        return None if not n or deleted else bytes(snapshot)

    def get_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """The latest snapshot of each of these keys that has one (a key never saved, or deleted,
        is absent): what :meth:`get` gives one key, for a batch's quiet keys in one query per
        :data:`GET_MANY_CHUNK` keys, not one look-up each (docs/performance-log.md, "Memory per resource")."""
        return {key: snapshot for key, (_, snapshot) in self.get_many_placed(keys).items()}

    def get_many_placed(self, keys: Sequence[str]) -> dict[str, tuple[int, bytes]]:
        """:meth:`get_many` with the partition each key was saved under: whoever holds it delivers an
        alert on the key (a resolution made from a state reclaimed unread, :meth:`Engine.ended_in`)."""
        found: dict[str, tuple[int, bytes]] = {}
        for i in range(0, len(keys), GET_MANY_CHUNK):
            with self.conn.lock:
                result = self.conn.client.query(
                    f"SELECT key, argMax(partition, version) AS partition, argMax(snapshot, version) AS snapshot, "
                    f"argMax(deleted, version) AS deleted "
                    f"FROM {self.conn.db}.detector_state WHERE key IN %(keys)s GROUP BY key",
                    parameters={"keys": list(keys[i : i + GET_MANY_CHUNK])},
                    column_formats={"snapshot": "bytes"},
                )
            found.update((key, (int(partition), bytes(snapshot)))
                         for key, partition, snapshot, deleted in result.result_rows if not deleted)  # fmt: skip
        return found

    def delete(self, keys: Sequence[str]) -> None:
        """Tombstone keys whose state expired, so a restart does not bring them back."""
        if not keys:
            return
        self.conn.insert("detector_state", [[k, 0, b"", 1, time.time_ns(), 0.0, 0] for k in keys], column_names=_STATE_COLS)


class SavedTimes:
    """The keys a worker loaded at assignment (:meth:`States.load`), in the order of their latest
    event time, for its sweeps to reclaim those that have not spoken by the time the watermark is
    past their TTL: a key loaded but never taken is in no engine's memory, so no engine's sweep
    sees it, and before a restart lost track of every quiet key (and of a delete a kill lost).
    16 bytes a key (a time in an array, a reference to the key the loaded dict holds) while the
    loaded dict holds it; a key taken from it (it spoke: the engine holds it by its own string) is
    let go of once such keys are half of those held (:meth:`before`), not kept till the next
    assignment (a key's string is ~70 bytes more). It also knows which of them may hold an open
    episode (:meth:`may_be_open`), saved beside their state: a sweep reads those alone."""

    def __init__(self, latest: dict[str, float], maybe_open: set[str] | None = None) -> None:
        self._maybe_open = maybe_open
        """Keys whose saved state may hold an open episode; None: not known, any may."""
        # Sorted by numpy, which lets go of the GIL while it sorts: built off the event loop at an
        # assignment, a million keys' sort by a Python key function held the loop still for ~1 s.
        times = np.fromiter(latest.values(), dtype=np.float64, count=len(latest))
        order = np.argsort(times, kind="stable")  # equal times keep the loaded order, as sorted() did
        keys = list(latest)
        self._keys: list[str] = [keys[i] for i in order.tolist()]
        self._times = array("d", times[order].tobytes())

    def may_be_open(self, key: str) -> bool:
        """Whether ``key``'s saved state may hold an open episode (saved so, or before that was saved)."""
        return self._maybe_open is None or key in self._maybe_open

    def before(self, horizon: float, loaded: Collection[str]) -> list[str]:
        """The keys whose latest time is before ``horizon`` still in ``loaded`` (not taken), each
        once; the keys given, and those no longer in ``loaded``, are let go of."""
        keys, times = self._keys, self._times
        end = bisect.bisect_left(times, horizon)
        given = [key for key in keys[:end] if key in loaded]
        del keys[:end], times[:end]
        if len(keys) > 2 * len(loaded):  # most of them taken: keep those still loaded
            kept = [i for i, key in enumerate(keys) if key in loaded]
            self._keys = [keys[i] for i in kept]
            self._times = array("d", [times[i] for i in kept])
        return given
