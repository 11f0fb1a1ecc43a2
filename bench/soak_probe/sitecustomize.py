"""Loaded by every Python process started with this folder on ``PYTHONPATH`` (``bench/soak.py`` puts it
there for the worker it watches, and so for the worker's event writer child): a daemon thread that, every
``SOAK_PROBE_S`` seconds, appends one JSON line to ``$SOAK_PROBE_DIR/probe-<pid>.jsonl`` with the
Python heap (``sys.getallocatedblocks``, and tracemalloc's traced bytes when it runs), the gc-tracked
objects by type (the 40 commonest), and the length of every container attribute (dict, set, list,
deque) holding at least ``SOAK_PROBE_MIN_LEN`` items on each live object of burnwatch's own classes
(``detector.*``, ``streams.*``): which of them grows with simulated time is what is attributed.

``SOAK_PROBE_COLLECT=1``: a full ``gc.collect()`` before each sample, so that what is counted is what is
alive, not cyclic garbage the worker's tuned collector (:func:`detector.runtime.tune_gc`) has not reached yet;
the objects it found unreachable are reported as ``collected``.

Not part of burnwatch: a measuring aid for ``bench/soak.py`` only.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import threading
import time


def _sample(min_len: int) -> dict:
    collected = gc.collect() if os.environ.get("SOAK_PROBE_COLLECT") == "1" else None
    objects = gc.get_objects()
    types = collections.Counter(type(o).__qualname__ for o in objects)
    owned: dict[str, int] = {}
    for obj in objects:
        cls = type(obj)
        module = cls.__dict__.get("__module__")
        if not isinstance(module, str) or not (module.startswith("detector.") or module.startswith("streams.")):
            continue
        try:
            attrs = vars(obj)
        except TypeError:
            names = [s for c in cls.__mro__ for s in getattr(c, "__slots__", ())]
            names += list(getattr(cls, "__struct_fields__", ()))
            attrs = {s: getattr(obj, s, None) for s in names if isinstance(s, str)}
        for name, value in list(attrs.items()):
            if isinstance(value, (dict, set, frozenset, list, collections.deque)) and len(value) >= min_len:
                label = f"{module}.{cls.__qualname__}.{name}"
                owned[label] = owned.get(label, 0) + len(value)
    del objects
    out = {"t": time.time(), "pid": os.getpid(), "argv": sys.argv[1:3], "blocks": sys.getallocatedblocks(),
           "gc_objects": sum(types.values()), "collected": collected, "types": dict(types.most_common(40)), "containers": owned}
    try:
        import tracemalloc

        if tracemalloc.is_tracing():
            out["traced"] = tracemalloc.get_traced_memory()[0]
    except Exception:  # noqa: BLE001
        pass
    return out


def _loop(path: str, every: float, min_len: int) -> None:
    while True:
        time.sleep(every)
        try:
            line = json.dumps(_sample(min_len))
        except Exception as exc:  # noqa: BLE001 - a measuring aid never takes the worker down
            line = json.dumps({"t": time.time(), "error": repr(exc)})
        with open(path, "a") as out:
            out.write(line + "\n")


if os.environ.get("SOAK_PROBE_DIR"):
    _path = os.path.join(os.environ["SOAK_PROBE_DIR"], f"probe-{os.getpid()}.jsonl")
    threading.Thread(target=_loop, args=(_path, float(os.environ.get("SOAK_PROBE_S", "20")),
                                          int(os.environ.get("SOAK_PROBE_MIN_LEN", "50"))),
                     daemon=True, name="soak-probe").start()
