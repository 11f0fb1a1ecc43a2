"""A planned call is checked again before it is made: it may come back from the audit table
(a restart, an approval hours later), and what is stored there is not trusted more than an
event. Its API must be the executor's, its parts valid, and its endpoint the configured one
(credentials go nowhere else)."""

from __future__ import annotations

from collections.abc import Callable

from detector.remediation.base import Call, Outcome
from detector.remediation.workloads import shown

__all__ = ["rechecked"]


def rechecked(call: Call, *, api: str, fields: tuple[str, ...], valid: Callable[..., bool], endpoint: str,
              executor: str, what: str) -> tuple[str, ...] | Outcome:  # fmt: skip
    """The call's ``fields`` (strings, in order) if it may be made; else a refusal saying why.
    ``executor`` names the executor and ``what`` the parts (``project/zone/instance``) in it."""
    parts = tuple(call.request.get(k) for k in fields)
    if call.api != api:
        return Outcome(ok=False, detail=f"refused: the {executor} executor does not make {shown(call.api)} calls")
    if not valid(*parts):
        return Outcome(ok=False, detail=f"refused: {'/'.join(shown(p) for p in parts)} is not a {what}")
    if call.endpoint and call.endpoint != endpoint:
        return Outcome(ok=False, detail=f"refused: planned for another endpoint ({shown(call.endpoint)})")
    if not all(isinstance(p, str) for p in parts):  # valid() said so; this tells the type checker
        return Outcome(ok=False, detail=f"refused: the parts of the {what} are not strings")
    return tuple(str(p) for p in parts)
