"""Reading a rule's saved state whose shape has changed since it was saved.

A state held more compactly than it was saved (fields moved into a part made only when needed)
would silently drop what the old shape held if msgspec ignored the fields it no longer knows. So
such a state class forbids unknown fields, and the class of the shape saved before it
(``saved_before``, a struct with an ``upgrade()`` to the current one, forbidding unknown fields
too: a state of the new shape refused for a field that does not hold is not read as an old one
with that field ignored) reads what the current class refuses. A shape neither reads is refused
(:class:`msgspec.ValidationError`): the engine then starts the rule afresh, as for any state it
cannot read.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import msgspec

from detector.floats import dec_hook

__all__ = ["Upgrades", "read_state"]

T = TypeVar("T")


class Upgrades(Protocol):
    """A shape saved before: read by msgspec, then made the state held now."""

    def upgrade(self) -> Any: ...


def read_state(raw: bytes, kind: type[T]) -> T:
    """``raw`` (msgpack) as a ``kind``, or as ``kind.saved_before`` upgraded when ``kind`` refuses it."""
    before: type[Upgrades] | None = getattr(kind, "saved_before", None)
    if before is None:
        return msgspec.msgpack.decode(raw, type=kind, dec_hook=dec_hook)
    try:
        return msgspec.msgpack.decode(raw, type=kind, dec_hook=dec_hook)
    except msgspec.ValidationError as refused:
        error = refused
    try:
        old = msgspec.msgpack.decode(raw, type=before, dec_hook=dec_hook)
    except msgspec.ValidationError:
        raise error from None  # neither shape: why the current one refused it
    try:
        state = old.upgrade()
    except (ValueError, TypeError) as exc:
        raise msgspec.ValidationError(f"a state saved before could not be upgraded: {exc}") from exc
    if not isinstance(state, kind):
        raise msgspec.ValidationError(f"{type(old).__name__}.upgrade() made no {kind.__name__}")
    return state
