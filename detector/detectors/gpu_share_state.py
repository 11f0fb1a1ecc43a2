"""A host's state for ``partly_idle_gpu`` and ``unallocated_gpu`` (:mod:`detector.detectors.gpu_share`): its
GPUs and their units as columns, the gaps in its scrapes and the candidate waiting for its billing kept for usage
read behind the samples, and the shapes snapshots saved before, read into it (:class:`GpuShareStateBefore`).

One array of doubles holds every time, in three parts: per GPU :data:`PER_GPU` figures at the places
:data:`GPU_SEEN`, :data:`IDLE_SINCE`, :data:`PENDING_S` and :data:`PENDING_FROM`; per unit its latest sample;
then, once a sample said who holds a unit, per unit the newest that did. A time not set is :data:`UNSET` (NaN).
"""

from __future__ import annotations

import builtins
import math
from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import msgspec

from detector.detectors.base import shared
from detector.detectors.episode import GAP, Ended, Episode, is_ended, with_gaps
from detector.detectors.pods import MAX_UNITS, Pod
from detector.floats import FloatArray, floats

__all__ = ["BUSY_BIT", "BUSY_CODES", "DIP", "GPU_SEEN", "HOLDER", "HOLDER_BITS", "HOLDER_CODE", "IDLE_SINCE",
           "MAX_GAPS", "PENDING_FROM", "PENDING_S", "PER_GPU", "UNSET", "Gap", "GpuShareState", "GpuShareStateBefore",
           "UnbilledCandidate", "UnbilledEnded", "is_set", "place", "set_counted", "shared_flags"]


UNSET = math.nan
"""A time not set (None in the structs before; event times are finite)."""
_U = 2
"""Floats per unit in :attr:`GpuShareState.unit_times` as snapshots saved it before :attr:`GpuShareState.gpu_times`
held every time: its latest sample, and its newest that said who holds it."""
_SEEN, _ALLOCATED_AT = 0, 1
PER_GPU = 4
"""Floats per GPU at the head of :attr:`GpuShareState.gpu_times`: below, their places."""
GPU_SEEN, IDLE_SINCE, PENDING_S, PENDING_FROM = 0, 1, 2, 3
BUSY_BIT = 1
"""A unit's code (:attr:`GpuShareState.unit_codes`): bit 0 busy, bits 1-2 who holds it (:data:`HOLDER`)."""
HOLDER_CODE = {None: 0, True: 2, False: 4}
HOLDER = (None, True, False)
"""A unit's ``allocated`` by its code's bits 1-2 (``code >> 1``)."""
HOLDER_BITS = bytes(code & ~BUSY_BIT for code in range(256))
"""A ``bytes.translate`` table: the codes with their busy bit cleared (who holds each unit)."""
BUSY_CODES = bytes(code for code in range(256) if code & BUSY_BIT)
"""The codes of busy units: what ``bytes.translate`` deletes to leave the units not busy."""
_GROUP_SHARE_MAX = 64
"""Tuples of units or GPUs up to this long are shared between hosts (:func:`shared`); longer (a MIG
host's hundreds of instances) are kept as they are."""


MAX_GAPS = 4
"""Gaps a host keeps at most (:attr:`GpuShareState.gaps`), as ``idle_gpu``."""
DIP = 5
"""Figures a dip a candidate kept holds (:attr:`UnbilledCandidate.dips`)."""


def _share(items: tuple[Any, ...]) -> tuple[Any, ...]:
    return shared(items) if len(items) <= _GROUP_SHARE_MAX else items


def place(items: tuple[Any, ...], item: Any) -> int:
    """The place of ``item`` in ``items``, or -1."""
    try:
        return items.index(item)
    except ValueError:
        return -1


def is_set(x: float) -> bool:
    """Whether a time of the per-GPU fields is set (not :data:`UNSET`)."""
    return x == x


if TYPE_CHECKING:
    Flags = bytes
else:
    Flags = bytes | None
"""The counted GPUs' type as decoded: the code before saved None where no GPU was tracked (its
default, written out), read as ``b""`` (:meth:`GpuShareState.__post_init__`)."""


class Gap(msgspec.Struct, tag="gap", array_like=True, frozen=True, gc=False, forbid_unknown_fields=True):
    """A gap in the host's scrapes longer than :data:`~detector.detectors.episode.STOP_GAP_S` while an episode, an
    idle run or a whole-idle spell was under way, kept until usage is read past it (:attr:`GpuShareState.gaps`): a
    stop read later and dated within it (a host restarted while its usage was read behind) ends the episode there,
    and the GPUs idle across it start again from their first sample after it, as in time order
    (:func:`~detector.detectors.gpu_share._gap_holding`)."""

    before: float
    """The host's last scrape before it."""
    after: float
    """Its first scrape after."""
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """The episode's dollars and unpriced host-seconds as the scrape before it left them, before it was judged."""
    waste_after_usd: float = 0.0
    unpriced_after_s: float = 0.0
    """... and as the first scrape after it left them (:func:`~detector.detectors.gpu_share._counted_to`)."""
    past: bool = False
    """Kept past the end of the episode it came in (:func:`~detector.detectors.gpu_share._past`): its dollars are
    no episode's (0.0), its GPUs' returns still say where a stop read later in it restarts them."""
    returns: tuple[tuple[int, float], ...] = ()
    """``(GPU index, first sample)`` of each GPU missing from its first scrape that has reported since, or back
    since from a telemetry gap of its own (:func:`~detector.detectors.gpu_share._note_back`,
    :func:`~detector.detectors.gpu_share._note_dark`): once a GPU, the latest."""
    rebase_at: float | None = None
    """A whole-host idle spell that spanned it lasted ``for`` and set :attr:`GpuShareState.rebase_at` to this (a
    stop read later in it cut that spell there: :meth:`~detector.detectors.gpu_share.GpuShare._on_usage`)."""
    dip: tuple[float, float] | None = None
    """The start and the end of the latest whole-host dip (a spell shorter than ``for``, in which no GPU counted)
    that ended while it or a gap kept before it was kept (a gap kept takes the latest gap's):
    :func:`~detector.detectors.gpu_share._firing_scrape`."""

    def figures(self) -> tuple[float, ...]:
        """Its :data:`~detector.detectors.episode.GAP` figures, as an :data:`~detector.detectors.episode.Ended` holds a gap."""
        return (self.before, self.after, self.waste_usd, self.unpriced_s, self.waste_after_usd, self.unpriced_after_s)


class UnbilledCandidate(msgspec.Struct, tag="candidate", array_like=True, frozen=True, gc=False,
                        forbid_unknown_fields=True):
    """A candidate that would have fired but for the host's billing (no usage read yet, or a stop read before the
    usage of a restart: the usage topic read behind the samples), while it runs (:attr:`GpuShareState.unbilled`).
    Usage read later that says billed makes it fire as time order fired it
    (:meth:`~detector.detectors.gpu_share.GpuShare._fired`)."""

    fired_at: float
    """Its fire's date."""
    scrape: float | None = None
    """The scrape that would have fired it, where that scrape is the one time order judged it at (the first past the
    fire's date, or the end of a whole-host dip that held the date), with what it counted below. None: not kept (a
    scrape later, or a state saved before), or usage said billed after it."""
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """The candidate's dollars and unpriced host-seconds as :attr:`scrape` left them."""
    share_of: float = 0.0
    """The GPUs a GPU's seconds were a share of at :attr:`scrape` (those reporting, where no usage has said the
    host's count: time order, which had read it, counted a smaller share)."""
    billed_before: bool = False
    """Usage dated before :attr:`scrape` said billed: time order fired it there, with what that scrape counted."""
    billed_at: float | None = None
    """Usage dated at or after the scrape that would have fired it, read after samples past it, said billed: that
    usage's date, at which time order judged it (or the end of the whole-host dip it fell in, :attr:`dips`: no GPU
    counts in a dip, so time order judged it there)."""
    dips: tuple[float, ...] | None = None
    """Each of the latest whole-host dips (spells shorter than ``for``) that ended while it ran, or at the scrape
    that made it, oldest first, at most :data:`MAX_GAPS` (usage read later may be dated in any): :data:`DIP`
    figures each, its start and end, then what the scrape that ended it counted (time order, billed within it,
    fired there with those dollars): ``waste_usd``, ``unpriced_s`` and ``share_of`` as :attr:`scrape`'s, NaN
    where no fire was judged there. Saved before 2026-12-07 as the latest dip alone, its start and end: read so
    (:meth:`GpuShareState.__post_init__`), with its dollars NaN."""

    def dip_holding(self, when: float) -> tuple[float, ...] | None:
        """The dip it kept that holds ``when``, if any: :data:`DIP` figures (its dollars NaN where not noted)."""
        dips = self.dips or ()
        for k in range(0, len(dips), DIP):
            if dips[k] <= when < dips[k + 1]:
                return dips[k : k + DIP]
        return None

    def dip_spans(self) -> list[tuple[float, float]]:
        """The start and end of each dip it kept."""
        dips = self.dips or ()
        return [(dips[k], dips[k + 1]) for k in range(0, len(dips), DIP)]

    def with_dip(self, start: float, end: float,
                 counted: tuple[float, float, float] | None = None) -> UnbilledCandidate:  # fmt: skip
        """It, having kept the dip from ``start`` to ``end``, with what the scrape that ended it ``counted`` if it
        judged a fire there (the oldest let go past :data:`MAX_GAPS`)."""
        kept = self.dips or ()
        if kept and kept[-DIP + 1] == end:  # (noted again by the same scrape, the dollars now)
            kept = kept[:-DIP]
        noted = counted or (math.nan, math.nan, math.nan)
        return msgspec.structs.replace(self, dips=(*kept, start, end, *noted)[-DIP * MAX_GAPS :])


class UnbilledEnded(msgspec.Struct, tag="ended", array_like=True, frozen=True, gc=False, forbid_unknown_fields=True):
    """A candidate that would have fired but for the host's billing and ended unfired (its GPUs busy, or a whole-host
    spell's start), kept until usage is read past it (:attr:`GpuShareState.unbilled`): usage that says billed before
    its end fires and resolves it, as time order did (:meth:`~detector.detectors.gpu_share.GpuShare._billed_late`)."""

    since: float
    """When its GPUs' idle time began (the episode's start, had it fired)."""
    fired_at: float
    """Its fire's date, had it been billed."""
    ended_at: float
    """The scrape that ended it."""
    waste_usd: float
    unpriced_s: float
    """Its dollars and unpriced host-seconds when it ended."""
    whole_host: bool
    """A whole-host idle spell ended it (``idle_gpu``'s from there), not a GPU turning busy."""
    gaps: tuple[float, ...] = ()
    """Its gaps, :data:`~detector.detectors.episode.GAP` figures each, as an
    :data:`~detector.detectors.episode.Ended` holds them."""


class GpuShareState(Episode, kw_only=True, forbid_unknown_fields=True):
    """A host's GPUs and their units as columns (struct of arrays): one value per unit or GPU,
    indexed by its place, not a dict of one struct per unit and per GPU (~1.8 KB on a host of eight
    GPUs, ~0.7 KB now). Every time is in one array of doubles (one header, not one per column),
    the units' codes in one of bytes, the GPUs counted in shared bytes. Tuples of keys are shared
    between hosts alike; unset times are NaN. A state saved in a shape before is read by
    :class:`GpuShareStateBefore` (unknown fields are refused, so that none is dropped unread)."""

    unit_keys: tuple[str, ...] = ()
    """Each GPU or MIG instance (a unit) seen, by key ("3", or "3/1" for a MIG instance), in the
    order first seen: a unit's place in the fields below."""
    unit_gpus: tuple[int, ...] = ()
    """The GPU of each unit."""
    unit_codes: bytearray | None = None
    """Per unit, whether its latest sample was busy and who held it (:data:`BUSY_BIT`, :data:`HOLDER`)."""
    unit_pods: list[Pod | None] | None = None
    """Per unit, the pod its latest sample named (None: no unit ever named one)."""
    gpu_ids: tuple[int, ...] = ()
    """Each physical GPU tracked, by index, in the order first seen: a GPU's place in the fields below."""
    gpu_units: tuple[tuple[str, ...], ...] = ()
    """Per GPU, its units' keys (one, or its MIG instances): a whole GPU's is one tuple shared by
    every host (:data:`~detector.detectors.gpu_share._ALONE`)."""
    gpu_times: FloatArray | None = None
    """Every time, in three parts. Per GPU, :data:`PER_GPU` times (newest sample of any of its units;
    first idle sample after its last busy one, unset: busy or not seen idle yet; host-seconds,
    its share of the host, idle while another GPU worked before it counted, priced once it does;
    when those began). Then per unit, its latest sample. Then, only once a sample has said who
    holds a unit (``allocated`` not None: Kubernetes), per unit the newest that did (0.0 where
    none; :meth:`set_allocated_at`): 8 bytes a unit less on every host off Kubernetes."""
    gpu_counted: Flags = b""
    """Per GPU, 1 while in the episode's set: bytes, not a bytearray, one object for every host with the
    same flags (:func:`shared_flags`; most hosts' are all 0), replaced when a GPU joins or leaves the set."""
    model: str = ""
    covered_until: float = 0.0
    """Time of the newest sample seen: time is only counted up to here."""
    fired_by: float | None = None
    """Time of the scrape that fired the open episode (None: none open), by which a stop read after it
    and dated before it takes the fire back (:func:`~detector.detectors.episode.withdraws`). Set before the
    fire by a scrape that would have fired it but for the host's billing, not known yet (no usage read:
    its topic read behind the samples), as time order fires it there. NaN
    (:data:`~detector.detectors.gpu_share._RESTARTED`) from a stop read late that restarted GPUs in the past to
    the fire (or the end of the episode: :meth:`~Episode.clear`)."""
    ended: Ended | None = None
    """The episode a scrape resolved last, with its gaps (:attr:`gaps`), while a stop read later may still take
    it back or correct it (:func:`~detector.detectors.episode.take_back_ended`); not cleared with the episode."""
    whole_idle_since: float | None = None
    """Start of the current spell with no GPU of the host busy."""
    rebase_at: float = 0.0
    """End of the latest whole-host idle spell that lasted ``for`` (``idle_gpu``'s): GPUs count
    their idle time again from here, as if their idle runs began then."""
    stopped_at: float = 0.0
    """When the host was last seen stopped: samples from before it are history."""
    listed: tuple[int, ...] = ()
    """The GPUs of the latest finding (a resolution names what was idle), or of a candidate that would have
    fired but for the host's billing (:attr:`unbilled`)."""
    left: str = ""
    """Why a GPU left the set since the clock last moved ('' = none left)."""
    waste_usd: float = 0.0
    unpriced_s: float = 0.0
    """Host-seconds counted before the host's price was known."""
    spell_s: float = 0.0
    """Host-seconds of the counted GPUs in the current whole-host idle spell: charged if it ends
    short of ``for``, dropped if it lasts (then it is ``idle_gpu``'s)."""
    charged: FloatArray | None = None
    """While an episode is open, ``t, waste_usd, unpriced_s`` as each scrape left them, back to the first
    at or before ``stale_after`` before the newest (None: no episode open, most hosts): a stop read
    after later scrapes puts the dollars back to those of the latest scrape not after it, as they
    stood when read in event-time order."""
    gaps: tuple[Gap, ...] | None = None
    """The gaps in the host's scrapes kept (:class:`Gap`), oldest first: at most :data:`MAX_GAPS`, the shortest
    before the latest giving way (a missed or late scrape does not hide a restart's, nor a host dark again before
    its usage is read its first gap; :func:`~detector.detectors.gpu_share._keep_gap`). None: none, most hosts."""
    unbilled: UnbilledCandidate | UnbilledEnded | None = None
    """A candidate that would have fired but for the host's billing: while it runs, its fire's date and what the
    scrape that would have fired it counted, its GPUs in :attr:`listed` (:class:`UnbilledCandidate`); once it ended
    unfired, its dollars and gaps until usage is read past it (:class:`UnbilledEnded`). A stop within it, or usage
    from its end on, lets it go. One at a time: a candidate while one is held is not kept."""
    saved_before: ClassVar[builtins.type[GpuShareStateBefore]]

    def __post_init__(self) -> None:
        self.gpu_counted = shared_flags(self.gpu_counted) if self.gpu_counted else b""  # (None: saved before, no GPU)
        kept = self.unbilled
        if isinstance(kept, UnbilledCandidate) and kept.dips is not None and len(kept.dips) == 2:
            # (saved before 2026-12-07: the latest dip alone, with no dollars noted)
            self.unbilled = msgspec.structs.replace(kept, dips=(*kept.dips, math.nan, math.nan, math.nan))
        if not self._lined_up():
            raise ValueError("a host's columns, a value per unit or GPU in each (times, codes, flags 0 or 1)")

    def _lined_up(self) -> bool:
        """Whether every column holds a value per unit or per GPU, as the methods below keep them: a
        saved state that does not is refused (the rule starts afresh), never read out of place."""
        n, g = len(self.unit_keys), len(self.gpu_ids)
        times, codes, pods = self.gpu_times, self.unit_codes, self.unit_pods
        return (len(self.unit_gpus) == n and len(self.gpu_units) == g
                and len(times or ()) in (PER_GPU * g + n, PER_GPU * g + 2 * n)
                and len(codes or ()) == n and (pods is None or len(pods) == n)
                and len(self.gpu_counted) == g and not self.gpu_counted.strip(b"\0\1")
                and (self.gaps is None or 0 < len(self.gaps) <= MAX_GAPS)
                and all(len(gap.returns) <= MAX_UNITS for gap in self.gaps or ())
                and (self.ended is None or is_ended(self.ended))
                and _held_in_shape(self.unbilled))  # fmt: skip

    def clear(self) -> None:
        super().clear()
        self.waste_usd = self.unpriced_s = self.spell_s = 0.0
        self.fired_by = self.charged = self.gaps = None

    # -- the columns ----------------------------------------------------------

    def unit(self, key: str, gpu: int) -> int:
        """The place of unit ``key`` of GPU ``gpu``, or -1 (a whole GPU's is usually at its index)."""
        keys = self.unit_keys
        return gpu if gpu < len(keys) and keys[gpu] == key else place(keys, key)

    def gpu(self, gpu: int) -> int:
        """The place of GPU ``gpu``, or -1 (usually at its index)."""
        ids = self.gpu_ids
        return gpu if gpu < len(ids) and ids[gpu] == gpu else place(ids, gpu)

    def add_unit(self, key: str, gpu: int, seen: float, allocated: bool | None, pod: Pod | None) -> int:
        """A new unit, last; its place."""
        j = len(self.unit_keys)
        # New arrays, sized exactly: extending one in place leaves room to grow on every host.
        times, end = self.gpu_times or floats(), PER_GPU * len(self.gpu_ids) + j  # the end of the units' latest samples
        new = array("d", (seen,))
        self.gpu_times = times + new if len(times) == end else times[:end] + new + times[end:] + array("d", (0.0,))
        self.unit_keys, self.unit_gpus = _share((*self.unit_keys, key)), _share((*self.unit_gpus, gpu))
        codes = bytes((HOLDER_CODE[allocated],))
        self.unit_codes = bytearray(codes) if self.unit_codes is None else self.unit_codes + codes
        if pod is not None or self.unit_pods is not None:
            self.unit_pods = [*(self.unit_pods or [None] * j), pod]
        return j

    def drop_unit(self, j: int) -> None:
        times, codes, n = self.gpu_times, self.unit_codes, len(self.unit_keys)
        assert times is not None and codes is not None
        seen = PER_GPU * len(self.gpu_ids) + j
        if len(times) > seen - j + n:  # the allocation times too: drop the unit's, the later place first
            times = times[: seen + n] + times[seen + n + 1 :]
        self.gpu_times, self.unit_codes = times[:seen] + times[seen + 1 :], codes[:j] + codes[j + 1 :]
        self.unit_keys = _share(self.unit_keys[:j] + self.unit_keys[j + 1 :])
        self.unit_gpus = _share(self.unit_gpus[:j] + self.unit_gpus[j + 1 :])
        if self.unit_pods is not None:
            del self.unit_pods[j]

    def add_gpu(self, gpu: int) -> int:
        """A new GPU, last, not seen idle and not counted; its place."""
        p = len(self.gpu_ids)
        times, new = self.gpu_times or floats(), array("d", (0.0, UNSET, 0.0, UNSET))
        self.gpu_times = times[: PER_GPU * p] + new + times[PER_GPU * p :]  # after the GPUs', before the units' times
        self.gpu_ids, self.gpu_units = _share((*self.gpu_ids, gpu)), _share((*self.gpu_units, ()))
        self.gpu_counted = shared_flags(self.gpu_counted + b"\0")
        return p

    def drop_gpu(self, p: int) -> None:
        self.gpu_ids = _share(self.gpu_ids[:p] + self.gpu_ids[p + 1 :])
        self.gpu_units = _share(self.gpu_units[:p] + self.gpu_units[p + 1 :])
        times, counted = self.gpu_times, self.gpu_counted
        assert times is not None
        self.gpu_times = times[: PER_GPU * p] + times[PER_GPU * p + PER_GPU :]
        self.gpu_counted = shared_flags(counted[:p] + counted[p + 1 :])

    def set_gpu_units(self, p: int, units: tuple[str, ...]) -> None:
        gpu_units = self.gpu_units
        self.gpu_units = _share((*gpu_units[:p], units, *gpu_units[p + 1 :]))

    def set_allocated_at(self, j: int, t: float) -> None:
        """Unit ``j``'s newest sample that said who holds it is at ``t`` (the units' allocation times
        start with the host's first such sample)."""
        times = self.gpu_times
        assert times is not None
        n = len(self.unit_keys)
        start = PER_GPU * len(self.gpu_ids) + n
        if len(times) == start:  # the first sample of the host to say who holds its unit
            times = self.gpu_times = times + array("d", bytes(8 * n))  # 0.0 for every unit
        times[start + j] = t

    def holder(self, j: int) -> bool | None:
        """Who holds unit ``j`` as its latest sample said (``allocated``)."""
        return HOLDER[self.unit_codes[j] >> 1]  # type: ignore[index]

    def pod(self, j: int) -> Pod | None:
        return self.unit_pods[j] if self.unit_pods is not None else None

    def counted(self) -> list[int]:
        """The GPUs in the episode's set, in the order tracked."""
        flags = self.gpu_counted
        return [gpu for gpu, flag in zip(self.gpu_ids, flags, strict=True) if flag] if 1 in flags else []


def _held_in_shape(kept: UnbilledCandidate | UnbilledEnded | None) -> bool:
    """Whether a candidate unbilled holds only what the rule makes of one: once ended, whole gaps; while it runs,
    billed before the scrape it kept only with that scrape (and a share of GPUs to divide by), billed after one only
    without it (:meth:`~detector.detectors.gpu_share.GpuShare._on_usage`)."""
    if isinstance(kept, UnbilledEnded):
        return with_gaps(kept.gaps, 0)
    if isinstance(kept, UnbilledCandidate):
        dips = kept.dips
        if dips is not None and not (0 < len(dips) <= DIP * MAX_GAPS and len(dips) % DIP == 0
                                     and all(not share < 1.0 for share in dips[DIP - 1 :: DIP])):  # fmt: skip
            return False  # (DIP figures a dip, each with a share of a GPU or more, or NaN: not noted)
        if kept.scrape is None:
            return not kept.billed_before
        return kept.billed_at is None and kept.share_of >= 1.0
    return True


class Unit(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """The latest sample of one GPU or MIG instance, as snapshots saved it before the unit fields
    of :class:`GpuShareState` (read into them on decoding)."""

    gpu: int
    seen: float
    busy: bool = False
    allocated: bool | None = None
    allocated_at: float = 0.0
    pod: Pod | None = None


class GpuTrack(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One physical GPU's idle run, as snapshots saved it before the GPU fields of
    :class:`GpuShareState` (read into them on decoding)."""

    units: tuple[str, ...] = ()
    seen: float = 0.0
    idle_since: float | None = None
    pending_s: float = 0.0
    pending_from: float | None = None
    counted: bool = False


class GpuShareStateBefore(GpuShareState, kw_only=True, forbid_unknown_fields=True):
    """A host's state as snapshots saved it before 2026-12-06: besides the fields of the state held now, one
    gap (``resumed``), and in older shapes the units' times an array apart (``unit_times``) or one struct
    per unit and per GPU (``units``, ``gpus``); and the gaps and the candidate unbilled as figures
    (:func:`_gap_of`, :func:`_unbilled_of`), as saved before their structs. Read only to be made a
    :class:`GpuShareState` (:meth:`upgrade`): the state held now has no slot for them (8 bytes each on a GPU
    host's two states)."""

    unit_times: FloatArray | None = None
    """Per unit, (latest sample, newest that said who holds it), as saved before :attr:`gpu_times` held them."""
    units: dict[str, Unit] | None = None
    gpus: dict[int, GpuTrack] | None = None
    """The units and GPUs as saved before the columns."""
    resumed: tuple[float, ...] | None = None
    """The one gap saved before :attr:`gaps`: its dollars before it only (after it the same), then the
    GPUs' returns."""
    gaps: list[Any] | None = None  # type: ignore[assignment]  # (figures, or the structs: read by upgrade)
    """The gaps kept, each as figures (:func:`_gap_of`) as saved before :class:`Gap`, or as one."""
    unbilled: list[Any] | None = None  # type: ignore[assignment]
    """The candidate unbilled as figures (:func:`_unbilled_of`), as saved before :class:`UnbilledCandidate` and
    :class:`UnbilledEnded`, or as one of them."""

    def __post_init__(self) -> None:
        """Read as saved: :meth:`upgrade` checks what it makes."""

    def upgrade(self) -> GpuShareState:
        fields = {name: getattr(self, name) for name in GpuShareState.__struct_fields__}
        gaps = self.gaps
        if self.resumed is not None:
            gap = self.resumed
            if len(gap) < 4 or len(gap) % 2 or gaps is not None:
                raise ValueError("a gap is its last scrape before, the first after, its dollars and the GPUs' returns")
            gaps = [(*gap[:4], gap[2], gap[3], *gap[4:])]
        if gaps is not None:
            fields["gaps"] = tuple(_saved_part(gap, Gap, _gap_of) for gap in gaps)
        if self.unbilled is not None:
            fields["unbilled"] = _saved_part(self.unbilled, UnbilledCandidate | UnbilledEnded, _unbilled_of)
        if self.unit_times is not None:  # the units' times an array apart, two a unit
            allocated_at = self.unit_times[_ALLOCATED_AT::_U]
            parts = (self.gpu_times or floats(), self.unit_times[_SEEN::_U], allocated_at if any(allocated_at) else floats())
            fields["gpu_times"] = parts[0] + parts[1] + parts[2]
        state = GpuShareState(**fields)
        if self.units is not None or self.gpus is not None:
            self._read_structs(state, self.units or {}, self.gpus or {})
            if not state._lined_up():
                raise ValueError("a host's units and GPUs, each once")
        return state

    @staticmethod
    def _read_structs(state: GpuShareState, units: dict[str, Unit], gpus: dict[int, GpuTrack]) -> None:
        """One struct per unit and per GPU, as saved before the columns, into ``state``'s columns."""
        for key, unit in units.items():
            j = state.add_unit(key, unit.gpu, unit.seen, unit.allocated, unit.pod)
            if unit.allocated_at:
                state.set_allocated_at(j, unit.allocated_at)
            if unit.busy:
                state.unit_codes[j] |= BUSY_BIT  # type: ignore[index]
        for gpu, track in gpus.items():
            p = state.add_gpu(gpu)
            state.set_gpu_units(p, track.units)
            times = state.gpu_times
            assert times is not None
            at = PER_GPU * p
            times[at + GPU_SEEN], times[at + PENDING_S] = track.seen, track.pending_s
            times[at + IDLE_SINCE] = UNSET if track.idle_since is None else track.idle_since
            times[at + PENDING_FROM] = UNSET if track.pending_from is None else track.pending_from
            if track.counted:
                set_counted(state, p, 1)


def _saved_part(raw: Any, kind: Any, of_figures: Callable[[tuple[float, ...]], Any]) -> Any:
    """A part of a state saved before, ``raw``: a struct of ``kind`` as saved since (its tag first), or figures as
    saved before it, made one by ``of_figures``."""
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"a saved part of a host's state is an array, not {raw!r:.40}")
    if isinstance(raw[0], str):
        try:
            return msgspec.convert(raw, kind)
        except msgspec.ValidationError as exc:
            raise ValueError(str(exc)) from None
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in raw):
        raise ValueError("figures saved before are numbers")
    return of_figures(tuple(float(x) for x in raw))


def _gap_of(figures: tuple[float, ...]) -> Gap:
    """A gap kept, as states saved it before 2026-12-06 (evening): its last scrape before, the first after, the
    dollars and unpriced seconds before and after it (``waste_usd`` -1.0 once kept past its episode), then pairs
    of a key and a time: a GPU's index and its return, or -1 a rebase, -2 and -3 a dip's start and end."""
    if len(figures) < GAP or len(figures) % 2:
        raise ValueError("a gap is its two times, its dollars before and after, then pairs of a key and a time")
    notes: dict[int, float] = {}
    for k in range(GAP, len(figures), 2):
        key = figures[k]
        if not (key.is_integer() and -3 <= key < MAX_UNITS) or int(key) in notes:
            raise ValueError(f"a gap's note is a GPU's index, or -1, -2 or -3, each once, not {key!r}")
        notes[int(key)] = figures[k + 1]
    returns = [(gpu, back) for gpu, back in notes.items() if gpu >= 0]
    rebase_at, dip_start, dip_end = notes.get(-1), notes.get(-2), notes.get(-3)
    past = figures[2] == -1.0
    waste, unpriced, waste_after, unpriced_after = (0.0, 0.0, 0.0, 0.0) if past else figures[2:GAP]
    dip = (dip_start, dip_end) if dip_start is not None and dip_end is not None else None
    return Gap(figures[0], figures[1], waste, unpriced, waste_after, unpriced_after, past=past, returns=tuple(returns),
               rebase_at=rebase_at, dip=dip)  # fmt: skip


def _unbilled_of(figures: tuple[float, ...]) -> UnbilledCandidate | UnbilledEnded:
    """The candidate unbilled, as states saved it before 2026-12-06 (evening): while it ran, its fire's date alone,
    then with what the scrape that would have fired it counted (five figures: the date, that scrape's time,
    negated once usage dated before it said billed, ``waste_usd``, ``unpriced_s``, the GPUs it shared by), or the
    date and that of usage after it that said billed (two); once it ended, six figures then its gaps."""
    n = len(figures)
    if n == 1:
        return UnbilledCandidate(figures[0])
    if n == 2:
        return UnbilledCandidate(figures[0], billed_at=figures[1])
    if n == 5:
        fired_at, scrape, waste_usd, unpriced_s, share_of = figures
        return UnbilledCandidate(fired_at, abs(scrape), waste_usd, unpriced_s, share_of, billed_before=scrape < 0.0)
    if with_gaps(figures, 6):
        since, fired_at, ended_at, waste_usd, unpriced_s, whole_host = figures[:6]
        return UnbilledEnded(since, fired_at, ended_at, waste_usd, unpriced_s, bool(whole_host), figures[6:])
    raise ValueError("a candidate unbilled is 1, 2 or 5 figures while it runs, or 6 and whole gaps once ended")


GpuShareState.saved_before = GpuShareStateBefore


def set_counted(st: GpuShareState, g: int, flag: int) -> bytes:
    """GPU ``g`` in the episode's set (1) or not (0); the flags after."""
    flags = st.gpu_counted
    if flags[g] != flag:
        flags = st.gpu_counted = shared_flags(flags[:g] + (b"\1" if flag else b"\0") + flags[g + 1 :])
    return flags


_FLAGS: dict[bytes, bytes] = {}
_MAX_FLAGS = 10_000


def shared_flags(flags: bytes) -> bytes:
    """One bytes object for every equal set of GPU flags up to :data:`_GROUP_SHARE_MAX` GPUs that hosts
    hold alike (a byte array on each cost 65 bytes on a host of eight); the table is bounded: past
    ``_MAX_FLAGS`` it starts afresh."""
    if len(flags) > _GROUP_SHARE_MAX:
        return bytes(flags)
    found = _FLAGS.get(flags)
    if found is None:
        if len(_FLAGS) >= _MAX_FLAGS:
            _FLAGS.clear()
        found = _FLAGS[flags] = bytes(flags)
    return found
