"""The code every event or scrape runs holds no closure.

CPython 3.11 makes each local that a lambda, comprehension or generator reads into a cell at every
call of the function holding it, whether or not the closure runs: the rules' resolve lambdas and
small generators cost ~7k CPU instructions a usage event in cells alone before they went
(docs/performance-log.md, "A usage event's own cost, and closures in the per-event code"). This keeps
them out of the per-event methods of every registered rule and of the engine's and the aligner's
per-event code; a closure there belongs in a helper called only when it is needed
(``functools.partial`` for :func:`~detector.detectors.episode.end`,
:func:`~detector.detectors.base.at_sample`).
"""

from __future__ import annotations

import pytest

from detector.align import EventTimeAligner, _gather
from detector.detectors import REGISTRY
from detector.engine import Engine

PER_EVENT = ("step", "step_scrape", "starts", "starts_scrape", "_on_usage", "_advance", "_breaks", "_holds",
             "_keep_usual", "first_break", "_billing")  # fmt: skip


def _methods() -> list[tuple[str, object]]:
    found = [(f"Engine.{name}", getattr(Engine, name)) for name in ("_scrape", "_update_info")]
    found += [("align._gather", _gather), ("EventTimeAligner.push_many", EventTimeAligner.push_many),
              ("EventTimeAligner.push", EventTimeAligner.push)]  # fmt: skip
    for rule, cls in sorted(REGISTRY.items()):
        for name in PER_EVENT:
            method = getattr(cls, name, None)
            if method is not None and hasattr(method, "__code__"):
                found.append((f"{rule}.{name}", method))
    return found


@pytest.mark.parametrize(("name", "method"), _methods(), ids=[name for name, _ in _methods()])
def test_holds_no_closure(name, method):
    assert method.__code__.co_cellvars == (), f"{name} makes cells at every call: {method.__code__.co_cellvars}"
