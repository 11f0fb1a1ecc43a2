"""Prometheus text exposition, parsed with prometheus-client's own parser.

dcgm-exporter, kube-state-metrics and a Prometheus server's ``/federate`` all serve
the text format; the parser is the maintained one, never a hand-written one. What
this module adds is what a scraper needs around it: a flat list of samples with
their names as exposed, their timestamps kept (``/federate`` carries them), and a
clear error naming the target and the offending line instead of a traceback.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["LONG_LINE", "MAX_AHEAD_S", "MAX_BEHIND_S", "MAX_LINE_CHARS", "ExpositionError", "Sample", "instance_host",
           "parse_exposition", "plausible_time"]  # fmt: skip

MAX_LINE_SHOWN = 120
MAX_LINE_CHARS = 64 << 10
"""A line longer than this is left unparsed, and counted (:data:`LONG_LINE`). No series the bridge reads comes
near it (a GPU's sample is a few hundred characters; a pod's labels, each value at most 63, a few KiB); what does is
an annotation exported whole (kube-state-metrics' ``kube_pod_annotations`` with a pod's last-applied
configuration, up to Kubernetes' 256 KiB) or a hostile target. prometheus-client's parser copies a label value at
each escaped quote in it: parse time grows with the square of the line (a 256 KiB annotation ~0.4 s, a few MiB
hours), and one such line held the bridge's parsing thread for as long."""
LONG_LINE = f"line over {MAX_LINE_CHARS >> 10} KiB (not parsed)"
"""The skip reason of a line over :data:`MAX_LINE_CHARS`, on the bridge's ``burnwatch_bridge_skipped``."""
MAX_AHEAD_S = 300.0
"""A sample timestamp further than this ahead of the bridge's clock is not an event time (clock
skew between Prometheus and the bridge is seconds): refused, or one absurd line would move a
GPU's event time into the future and every later sample of it would look old."""
MAX_BEHIND_S = 3600.0
"""A sample timestamp further than this behind the bridge's clock is not a live scrape's: a timestamp in
seconds where the format has milliseconds (1970-01-21), or a /federate answering a series' last sample from
long ago (VictoriaMetrics looks back a day; Prometheus 5 minutes). The DCGM mapper forgets a GPU's last time
after as long (``STATE_TTL_S``): older, the same sample would be new again at every scrape."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: ``name{labels} value [timestamp]``; ``timestamp`` in epoch seconds."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float | None = None


class ExpositionError(ValueError):
    """A response that is not Prometheus text; the message names the target and the line."""

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"{target}: {reason}")
        self.target = target
        self.reason = reason


def parse_exposition(text: str | bytes, target: str, skipped: Counter[str] | None = None) -> list[Sample]:
    """Every sample of one response, in order. Counters are named as their family
    (the parser's OpenMetrics view adds ``_total`` to a counter exposed without it:
    ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` stays that, as the exporter spells it).
    Samples whose value is not finite (``NaN``, ``+Inf``) are kept: the mappers decide. Lines over
    :data:`MAX_LINE_CHARS` are left out, counted in ``skipped`` (:data:`LONG_LINE`)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExpositionError(target, f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None
    text = text.removeprefix("\ufeff")  # a byte-order mark would become part of the first metric's name
    if len(text) > MAX_LINE_CHARS:
        lines = text.split("\n")
        long = sum(len(line) > MAX_LINE_CHARS for line in lines)
        if long:  # left blank, not removed: a bad line after it is named by its own number (_bad_line)
            text = "\n".join("" if len(line) > MAX_LINE_CHARS else line for line in lines)
            if skipped is not None:
                skipped[LONG_LINE] += long
    try:
        families = list(text_string_to_metric_families(text))
    except Exception:  # the parser raises bare ValueError, IndexError...: find the line ourselves
        raise ExpositionError(target, _bad_line(text)) from None
    samples = []
    for family in families:
        counter = family.type == "counter"
        for s in family.samples:
            name = family.name if counter and s.name == family.name + "_total" else s.name
            samples.append(Sample(name, s.labels, float(s.value), None if s.timestamp is None else float(s.timestamp)))
    return samples


def _bad_line(text: str) -> str:
    """Which line the parser refuses, parsing each line alone (the parser does not say). Lines end at
    ``\n`` alone, as the parser reads them: ``splitlines`` also breaks at a label value's U+2028, NEL, form
    feed or lone CR, which named a good line, or none."""
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except Exception as exc:
            shown = line if len(line) <= MAX_LINE_SHOWN else line[:MAX_LINE_SHOWN] + "..."
            why = str(exc).split(":", 1)[0] if str(exc) else type(exc).__name__
            return f"not Prometheus text at line {number} ({why}): {shown!r}"
    return "not Prometheus text (the lines parse alone but not together: a TYPE or HELP line out of place?)"


def plausible_time(timestamp: float, now: float) -> bool:
    """Whether a sample's timestamp can be an event time: finite, at most :data:`MAX_BEHIND_S` behind
    ``now`` and :data:`MAX_AHEAD_S` ahead of it (a ``NaN``, ``1e14`` or seconds for milliseconds parse)."""
    return math.isfinite(timestamp) and now - MAX_BEHIND_S <= timestamp <= now + MAX_AHEAD_S


def instance_host(instance: str) -> str:
    """The host of an ``instance`` label or a target address: ``10.0.0.5:9400`` -> ``10.0.0.5``,
    ``[fd00::1]:9400`` -> ``fd00::1``, ``http://node-1:9400/metrics`` -> ``node-1``."""
    text = instance if "//" in instance else f"//{instance}"
    try:
        host = urlsplit(text).hostname
    except ValueError:
        host = None
    return host or instance
