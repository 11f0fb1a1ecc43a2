"""Detector state: each key's snapshot, saved with the write that stored its events, so a
restarted or newly assigned worker resumes where the last one stopped (docs/reliability.md)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from detector.store.connection import Connection

__all__ = ["States"]

_STATE_COLS = ["key", "partition", "snapshot", "deleted", "version"]
GET_MANY_CHUNK = 10_000
"""Keys per query of :meth:`States.get_many`: a few hundred kB of query text for ids of tens of
characters (10 MB at most: ids are at most 1,024 characters)."""


class States:
    """The ``detector_state`` table: the newest version of a key wins; a tombstone deletes it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def save(self, states: Sequence[tuple[str, int, bytes]], version: int) -> None:
        """Write (key, partition, snapshot) rows; the newest version of a key wins."""
        if not states:
            return
        cols = [[k for k, _, _ in states], [p for _, p, _ in states], [s for _, _, s in states],
                [0] * len(states), [version] * len(states)]  # fmt: skip
        with self.conn.lock:
            self.conn.client.insert(f"{self.conn.db}.detector_state", cols, column_oriented=True,
                                    column_names=_STATE_COLS)  # fmt: skip

    def load(self, partitions: Sequence[int], saved_within_s: float | None = None) -> dict[str, bytes | None]:
        """Every live key on these partitions → its latest snapshot; with ``saved_within_s``, only
        the keys saved within that many seconds of the partitions' newest save (a save's version
        is its wall-clock time) come with their snapshot, the rest with None, to be read one by
        one (:meth:`get`) if they speak again: a worker taking over a million keys, most of them
        quiet, does not hold every one's bytes until it speaks (docs/performance.md, Memory).
        From the newest save, not from now: after an outage longer than the horizon the keys
        that were live still come with their bytes, and catching up reads none of them one by one."""
        if not partitions:
            return {}
        within_ns = -1 if saved_within_s is None else int(saved_within_s * 1e9)
        db = self.conn.db
        with self.conn.lock:
            result = self.conn.client.query(
                f"WITH (SELECT max(version) FROM {db}.detector_state WHERE partition IN %(partitions)s) AS newest "
                f"SELECT key, (%(within)s < 0 OR version + %(within)s >= newest) AS recent, "
                f"if(recent, snapshot, '') AS snapshot FROM {db}.detector_state FINAL "
                "WHERE partition IN %(partitions)s AND deleted = 0",
                parameters={"partitions": list(partitions), "within": within_ns},
                column_formats={"snapshot": "bytes"},
            )
        return {key: (snapshot if recent else None) for key, recent, snapshot in result.result_rows}

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
        :data:`GET_MANY_CHUNK` keys, not one look-up each (docs/performance.md, Memory)."""
        found: dict[str, bytes] = {}
        for i in range(0, len(keys), GET_MANY_CHUNK):
            with self.conn.lock:
                result = self.conn.client.query(
                    f"SELECT key, argMax(snapshot, version) AS snapshot, argMax(deleted, version) AS deleted "
                    f"FROM {self.conn.db}.detector_state WHERE key IN %(keys)s GROUP BY key",
                    parameters={"keys": list(keys[i : i + GET_MANY_CHUNK])},
                    column_formats={"snapshot": "bytes"},
                )
            found.update((key, bytes(snapshot)) for key, snapshot, deleted in result.result_rows if not deleted)
        return found

    def delete(self, keys: Sequence[str]) -> None:
        """Tombstone keys whose state expired, so a restart does not bring them back."""
        if not keys:
            return
        self.conn.insert("detector_state", [[k, 0, b"", 1, time.time_ns()] for k in keys], column_names=_STATE_COLS)
