"""dcgm-exporter exposition -> gpu-metrics events (detector.ingest.dcgm), on text written
as the exporter prints it (tests/exposition.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from detector.events import TOPIC_GPU_METRICS, EventDecoder, GpuMetric
from detector.ingest.dcgm import DcgmMapper, HostBatch
from detector.ingest.hosts import StaticHost
from detector.ingest.kube import KubeState, kube_state
from detector.ingest.prometheus import ExpositionError, parse_exposition
from tests.exposition import Gpu, dcgm_text, gpu_values, ksm_text, merge, node, pod

T = 1_796_000_000.0  # 2026-11-30T00:53:20Z: the scrape time when a sample carries none
TARGET = "10.0.3.7:9400"


def mapped(text: str, mapper: DcgmMapper | None = None, t: float = T, **kwargs: Any) -> list[HostBatch]:
    """Map one scrape and check every event against the contract, as the worker will decode it."""
    batches = (mapper or DcgmMapper()).map(parse_exposition(text, TARGET), t=t, instance=TARGET, **kwargs)
    for batch in batches:
        decoded = EventDecoder(clock=lambda: T + 3600).decode(TOPIC_GPU_METRICS, json.dumps(batch.events).encode())
        assert all(isinstance(e, GpuMetric) for e in decoded)
    return batches


def only(batches: list[HostBatch]) -> dict[str, Any]:
    assert len(batches) == 1 and len(batches[0].events) == 1, batches
    return batches[0].events[0]


def without_util(values: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in values.items() if k != "DCGM_FI_DEV_GPU_UTIL"}


K8S = {"pod": "train-7d9f-x2b", "namespace": "ml", "container": "trainer"}

# (case, GPU as the exporter prints it, fields the event must have, fields it must not have)
LABEL_CASES = [
    # released versions: the host label is `Hostname`; Kubernetes mode adds pod/namespace/container
    ("released Hostname, Kubernetes", Gpu(0, gpu_values(87, gr=0.91, tensor=0.4, dram=0.3), "gpu-node-1", labels=K8S),
     {"resource_id": "gpu-node-1", "gpu_index": 0, "util_pct": 87, "pod": "train-7d9f-x2b", "namespace": "ml",
      "container": "trainer", "allocated": True, "gpu_uuid": "GPU-gpu-node-1-0000", "model": "NVIDIA A100-SXM4-40GB",
      "gr_engine_active": 0.91, "tensor_active": 0.4, "dram_active": 0.3, "power_w": 250, "mem_used_mib": 30000,
      "mem_total_mib": 40536 + 424},
     {"hostname", "sm_active", "mig_instance"}),
    # newer versions spell it `hostname`
    ("newer hostname", Gpu(1, gpu_values(5), "gpu-node-2", host_label="hostname"),
     {"resource_id": "gpu-node-2", "gpu_index": 1, "util_pct": 5}, {"pod", "allocated"}),
    # older exporters: pod_name / pod_namespace / container_name
    ("old pod_name labels", Gpu(2, gpu_values(50), "gpu-node-1",
                                labels={"pod_name": "nb-0", "pod_namespace": "research", "container_name": "jupyter"}),
     {"pod": "nb-0", "namespace": "research", "container": "jupyter", "allocated": True}, set()),
    # after Prometheus relabelling: exported_pod is the GPU's pod, pod the exporter's own
    ("exported_* over the exporter's own pod", Gpu(0, gpu_values(50), "gpu-node-1",
     labels={"pod": "dcgm-exporter-abcde", "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter",
             "exported_pod": "train-1", "exported_namespace": "ml", "exported_container": "main"}),
     {"pod": "train-1", "namespace": "ml", "container": "main"}, set()),
    # dcgm-exporter's old-namespace flag writes `uuid`
    ("lower-case uuid label", Gpu(3, gpu_values(1), "gpu-node-1", uuid_label="uuid"),
     {"gpu_uuid": "GPU-gpu-node-1-0003"}, set()),
    # no host label at all: the instance label's host, here the scraped target's address
    ("no host label: the target's host", Gpu(0, gpu_values(1)), {"resource_id": "10.0.3.7"}, {"hostname"}),
    # MIG: one sample per instance; GPU_UTIL is not supported there, GR_ENGINE_ACTIVE stands in
    ("MIG instance without GPU_UTIL", Gpu(0, without_util(gpu_values(0, gr=0.25)), "gpu-node-3", mig=("1g.10gb", "7")),
     {"mig_profile": "1g.10gb", "mig_instance": "7", "gr_engine_active": 0.25, "util_pct": 25.0}, set()),
    # a ratio a hair above 1 is rounding: clamped
    ("ratio 1.004 clamped", Gpu(0, gpu_values(99, gr=1.004), "h"), {"gr_engine_active": 1.0}, set()),
    # a ratio far outside 0..1 is refused: the field is left out (and counted)
    ("ratio 1.5 refused", Gpu(0, gpu_values(99, gr=1.5, tensor=0.2), "h"), {"tensor_active": 0.2}, {"gr_engine_active"}),
    # no POWER_USAGE and the first energy reading: no power yet (average needs two)
    ("energy counter, first reading", Gpu(0, gpu_values(10, power=None, energy=5e9), "h"), {"util_pct": 10}, {"power_w"}),
]


@pytest.mark.parametrize("gpu, want, absent", [c[1:] for c in LABEL_CASES], ids=[c[0] for c in LABEL_CASES])
def test_label_mapping(gpu: Gpu, want: dict[str, Any], absent: set[str]) -> None:
    event = only(mapped(dcgm_text([gpu])))
    assert {k: event.get(k) for k in want} == want
    assert not absent & event.keys()
    assert event["ts"] == "2026-11-30T00:53:20Z"


def test_one_batch_per_host_and_timestamps_kept() -> None:
    """Two hosts in one response (a federate answer) -> two batches; a sample's own timestamp is its event time."""
    gpus = [Gpu(i, gpu_values(10 * i), "a", ts_ms=1_796_000_000_500) for i in range(4)]
    gpus += [Gpu(i, gpu_values(1), "b", host_label="hostname") for i in range(2)]
    batches = {b.host.name: b for b in mapped(dcgm_text(gpus))}
    assert set(batches) == {"a", "b"}
    assert [e["gpu_index"] for e in batches["a"].events] == [0, 1, 2, 3]
    assert {e["ts"] for e in batches["a"].events} == {"2026-11-30T00:53:20.500Z"}
    assert {e["ts"] for e in batches["b"].events} == {"2026-11-30T00:53:20Z"}


def test_gpu_without_util_is_skipped_and_counted() -> None:
    mapper = DcgmMapper()
    batches = mapped(dcgm_text([Gpu(0, without_util(gpu_values(10)), "h"), Gpu(1, gpu_values(3), "h")]), mapper)
    assert [e["gpu_index"] for e in batches[0].events] == [1]
    assert mapper.skipped == {"no DCGM_FI_DEV_GPU_UTIL (util_pct is required)": 1}


def test_out_of_range_is_counted() -> None:
    mapper = DcgmMapper()
    mapped(dcgm_text([Gpu(0, gpu_values(99, gr=1.5), "h"), Gpu(1, gpu_values(130), "h")]), mapper)
    assert mapper.skipped == {"gr_engine_active outside 0-1": 1, "util_pct outside 0-100": 1}


def test_power_from_the_energy_counter_and_its_reset() -> None:
    """Average power between two scrapes from the mJ counter; a counter that went down is a
    reset (a reboot): no value for that interval, as Prometheus' rate() treats it."""
    mapper = DcgmMapper()
    readings = [(0, 5_000_000_000), (30, 5_009_000_000), (60, 1_000_000), (90, 4_000_000)]
    powers = []
    for dt, mj in readings:
        event = only(mapped(dcgm_text([Gpu(0, gpu_values(50, power=None, energy=mj), "h")]), mapper, t=T + dt))
        powers.append(event.get("power_w"))
    assert powers == [None, 300.0, None, 100.0]  # 9e6 mJ / 30 s = 300 W; reset; 3e6 mJ / 30 s
    assert mapper.skipped == {"energy counter reset (no power for that interval)": 1}


def test_a_sample_not_newer_is_not_published_twice() -> None:
    """/federate repeats Prometheus' last scrape until the next one: the same timestamp is one sample."""
    mapper = DcgmMapper()
    text = dcgm_text([Gpu(0, gpu_values(50), "h", ts_ms=1_796_000_000_000)])
    assert mapped(text, mapper)
    assert mapped(text, mapper, t=T + 30) == []
    assert mapper.skipped == {"not newer than the last sample published": 1}


def _cluster(requested: list[int], allocatable: int = 8) -> KubeState:
    """A node `gpu-node-1` (an EC2 instance) whose pods request these GPU counts."""
    pods = [pod("ml", f"p{i}", "gpu-node-1", n) for i, n in enumerate(requested)]
    text = ksm_text(merge(node("gpu-node-1", "aws:///us-east-1a/i-0abc123", "p4d.24xlarge", "us-east-1", allocatable),
                          *pods))  # fmt: skip
    return kube_state(parse_exposition(text, "ksm:8080"), T)


def _host(labelled: int, gpus: int = 4, host: str = "gpu-node-1") -> str:
    return dcgm_text([Gpu(i, gpu_values(0), host, labels={"pod": f"p{i}", "namespace": "ml"} if i < labelled else {})
                      for i in range(gpus)])  # fmt: skip


# (case, kube-state-metrics state, exporter's page, target is kubernetes, allocated of GPUs 0..3)
ALLOCATION_CASES = [
    # pods request 2 GPUs and the exporter labels 2: the unlabelled ones are held by nobody
    ("all requests labelled", _cluster([1, 1]), _host(2), False, [True, True, False, False]),
    # no pod requests a GPU: every GPU is unallocated
    ("nothing requested", _cluster([]), _host(0), False, [False] * 4),
    # 3 requested, 1 labelled: the exporter is not in Kubernetes mode or behind; never guess which
    ("exporter behind the requests", _cluster([1, 2]), _host(1), False, [True, None, None, None]),
    # no kube-state-metrics at all: unknown, even on a node of a cluster
    ("no kube-state-metrics", None, _host(1), True, [True, None, None, None]),
    # ksm does not know this host, and the target is not said to be Kubernetes: not a Kubernetes node
    ("not a Kubernetes node", _cluster([]), _host(0, host="bare-metal-1"), False, [None] * 4),
    # `kubernetes: true`, but kube-state-metrics lists its nodes and this is none of them: the host
    # label names no node (an FQDN against a short name?): unknown, never "held by no pod"
    ("kubernetes: true, a host no node", _cluster([]), _host(0, host="bare-metal-1"), True, [None] * 4),
    # `kubernetes: true` with a kube-state-metrics that exports no node metrics: its requests name none
    ("kubernetes: true, ksm without nodes", kube_state(parse_exposition(ksm_text(
        pod("ml", "a", "other-node", 1)), "ksm"), T), _host(0, host="gpu-node-9"), True, [False] * 4),
    # a finished pod's request holds nothing
    ("requests of finished pods ignored", kube_state(parse_exposition(ksm_text(merge(
        node("gpu-node-1", "aws:///us-east-1a/i-0abc123", "p4d.24xlarge", "us-east-1", 8),
        pod("ml", "done", "gpu-node-1", 4, phase="Succeeded"))), "ksm"), T), _host(0), False, [False] * 4),
]  # fmt: skip


@pytest.mark.parametrize("kube, text, kubernetes, want", [c[1:] for c in ALLOCATION_CASES],
                         ids=[c[0] for c in ALLOCATION_CASES])  # fmt: skip
def test_allocation(kube: KubeState | None, text: str, kubernetes: bool, want: list[bool | None]) -> None:
    (batch,) = mapped(text, kube=kube, kubernetes=kubernetes)
    assert [e.get("allocated") for e in batch.events] == want


def test_resource_id_from_provider_id_or_static_map() -> None:
    kube = _cluster([1])
    (batch,) = mapped(_host(1), kube=kube)
    assert {e["resource_id"] for e in batch.events} == {"i-0abc123"}
    assert {e["hostname"] for e in batch.events} == {"gpu-node-1"}
    # a static entry is explicit: it wins over the providerID
    hosts = {"gpu-node-1": StaticHost(resource_id="i-0static", tags={"team": "infra"})}
    (batch,) = mapped(_host(0), kube=kube, hosts=hosts)
    assert {e["resource_id"] for e in batch.events} == {"i-0static"}
    assert batch.events[0]["tags"] == {"team": "infra"}


def test_workload_and_tags_from_kube_state() -> None:
    text = ksm_text(merge(
        node("gpu-node-1", "aws:///us-east-1a/i-0abc123", "p4d.24xlarge", "us-east-1", 8),
        pod("ml", "web-5d8f7-q2x", "gpu-node-1", 1, owner=("ReplicaSet", "web-5d8f7"), labels={"team": "search", "app": "web"}),
        {"kube_replicaset_owner": [({"namespace": "ml", "replicaset": "web-5d8f7", "owner_kind": "Deployment",
                                     "owner_name": "web", "owner_is_controller": "true"}, 1)],
         "kube_namespace_labels": [({"namespace": "ml", "label_team": "research", "label_owner": "alice"}, 1)]},
    ))  # fmt: skip
    kube = kube_state(parse_exposition(text, "ksm"), T)
    event = only(mapped(dcgm_text([Gpu(0, gpu_values(3), "gpu-node-1", labels={"pod": "web-5d8f7-q2x", "namespace": "ml"})]),
                        kube=kube))  # fmt: skip
    assert event["workload"] == "Deployment/web"
    assert event["tags"] == {"team": "search", "owner": "alice", "app": "web"}  # the pod's labels win over its namespace's


@pytest.mark.parametrize("body, reason", [
    (b"<html><body>Not the exporter</body></html>", "line 1 (invalid metric name)"),
    (b"# HELP x y\n# TYPE x gauge\nx{gpu=\"0\" 1\n", "line 3"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
    # a label value may hold any Unicode but \n (escaped): a line separator, NEL, a form feed or a lone CR in one is
    # part of its line, as the parser reads it; counting them as line breaks named a good line, or none
    ('x{pod="a\u2028b\x85c\x0cd\re"} 1\nx{pod="f"} 2\nnot a sample\n'.encode(),
     "line 3 (could not convert string to float): 'not a sample'"),
])  # fmt: skip
def test_garbage_names_target_and_line(body: bytes, reason: str) -> None:
    with pytest.raises(ExpositionError) as err:
        parse_exposition(body, "http://10.0.3.7:9400/metrics")
    assert str(err.value).startswith("http://10.0.3.7:9400/metrics: ")
    assert reason in str(err.value)


def test_a_pod_that_requests_no_gpu_holds_none() -> None:
    """dcgm-exporter names only pods the device plugin gave a GPU; a `pod` label naming a pod that
    kube-state-metrics says requests none is a scraper's label (the exporter's own pod), not a holder."""
    text = ksm_text(merge(node("gpu-node-1", "aws:///us-east-1a/i-0abc123", "p4d.24xlarge", "us-east-1", 8),
                          pod("gpu-operator", "nvidia-dcgm-exporter-x7k", "gpu-node-1", 0)))  # fmt: skip
    kube = kube_state(parse_exposition(text, "ksm"), T)
    mapper = DcgmMapper()
    labels = {"pod": "nvidia-dcgm-exporter-x7k", "namespace": "gpu-operator", "container": "exporter"}
    event = only(mapped(dcgm_text([Gpu(0, gpu_values(0), "gpu-node-1", labels=labels)]), mapper, kube=kube))
    assert "pod" not in event and event["allocated"] is False
    assert mapper.skipped == {"pod label names a pod that requests no GPU (the exporter's own?)": 1}


def test_mig_instances_are_the_units() -> None:
    """A MIG GPU: one event per instance (all with the GPU's index); the whole GPU's own series
    (power, framebuffer without GPU_I_ID) is no unit of its own."""
    mapper = DcgmMapper()
    gpus = [Gpu(0, {"DCGM_FI_DEV_POWER_USAGE": 120.0}, "h"),
            Gpu(0, without_util(gpu_values(0, power=None, gr=0.5)), "h", mig=("3g.20gb", "1")),
            Gpu(0, without_util(gpu_values(0, power=None, gr=0.0)), "h", mig=("3g.20gb", "2"))]  # fmt: skip
    (batch,) = mapped(dcgm_text(gpus), mapper)
    assert [(e["gpu_index"], e["mig_instance"], e["util_pct"]) for e in batch.events] == [(0, "1", 50.0), (0, "2", 0.0)]
    assert mapper.skipped == {"MIG parent GPU (its instances are published)": 1}


def test_time_sliced_gpu_is_one_sample() -> None:
    """A GPU shared by time-sliced pods has a series per pod: one event, the first pod's, counted."""
    mapper = DcgmMapper()
    gpus = [Gpu(0, gpu_values(30), "h", labels={"pod": "a", "namespace": "ml"}),
            Gpu(0, gpu_values(30), "h", labels={"pod": "b", "namespace": "ml"})]  # fmt: skip
    event = only(mapped(dcgm_text(gpus), mapper))
    assert (event["pod"], event["allocated"]) == ("a", True)
    assert mapper.skipped == {"more than one series of a GPU (time-sliced pods?): the first kept": 1}


def test_one_absurd_value_or_label_leaves_the_rest_of_the_host() -> None:
    """A message is refused whole by the worker: a GPU whose sample the contract cannot hold (power
    1e300 W, a 2,000-character pod label) is left out and counted, its host's other GPUs still go."""
    mapper = DcgmMapper()
    long_pod = {"pod": "p" * 2000, "namespace": "ml", "container": "c"}
    batches = mapped(dcgm_text([Gpu(0, gpu_values(0), "h"), Gpu(1, gpu_values(50, power=1e300), "h"),
                                Gpu(2, gpu_values(50), "h", labels=long_pod)]), mapper)  # fmt: skip
    assert [e["gpu_index"] for e in batches[0].events] == [0]
    assert sorted(mapper.skipped) == [
        "breaks the gpu-metrics contract: Expected `float` <= 3.4028234663852886e+38 - at `$.power_w`",
        "breaks the gpu-metrics contract: Expected `str` of length <= 1024 - at `$.pod`",
    ]


@pytest.mark.parametrize("stamp", ["NaN", "100000000000000000", "-5", str(int((T + 3600) * 1000))])
def test_an_absurd_sample_timestamp_is_refused_and_poisons_nothing(stamp: str) -> None:
    """A timestamp that parses (NaN, year 5000, before 1970, an hour ahead of the scrape) is no event
    time: that GPU is left out and counted, the others of the answer go, and the GPU's next sample
    with a real time is published (an accepted future time would have made every later one 'old')."""
    mapper = DcgmMapper()
    good = dcgm_text([Gpu(0, gpu_values(50), "other", ts_ms=int(T * 1000))])
    lines = dcgm_text([Gpu(0, gpu_values(50), "h")]).splitlines()
    bad = "".join(f"{line}\n" if line.startswith("#") else f"{line} {stamp}\n" for line in lines)
    batches = mapped(merge_pages(good, bad), mapper)
    assert [b.host.name for b in batches] == ["other"]
    assert mapper.skipped == {"sample timestamp not finite, over an hour behind or ahead of the scrape": 1}
    later = dcgm_text([Gpu(0, gpu_values(50), "h", ts_ms=int((T + 30) * 1000))])
    assert [b.host.name for b in mapped(later, mapper, t=T + 30)] == ["h"]


def merge_pages(*pages: str) -> str:
    """Two exporters' pages as one answer (a federate answer holds several hosts): a family's lines together."""
    families: dict[str, list[str]] = {}
    for page in pages:
        name = ""
        for line in page.splitlines():
            if line.startswith("# HELP"):
                name = line.split()[2]
                families.setdefault(name, [line, ""])
            elif line.startswith("# TYPE"):
                families[name][1] = line
            elif line:
                families[name].append(line)
    return "".join("\n".join(lines) + "\n" for lines in families.values())


def test_a_power_reading_that_is_not_a_number_is_counted_not_silently_dropped() -> None:
    mapper = DcgmMapper()
    (batch,) = mapped(dcgm_text([Gpu(0, gpu_values(50, power=float("nan")), "h")]), mapper)
    assert "power_w" not in batch.events[0] or batch.events[0]["power_w"] == 0.0
    assert mapper.skipped == {"power_w not a number or negative (the energy counter stands in)": 1}


def test_a_gpu_label_is_read_as_the_exporter_writes_it() -> None:
    """Decimal digits only: int() would take "1_0" for GPU 10, publish its 0 % and drop the real GPU 10's
    90 % as a second series of it; " 7" for GPU 7 alike."""
    mapper = DcgmMapper()
    text = dcgm_text([Gpu(11, gpu_values(0), "h"), Gpu(12, gpu_values(0), "h"), Gpu(10, gpu_values(90), "h")])
    batches = mapped(text.replace('gpu="11"', 'gpu="1_0"').replace('gpu="12"', 'gpu=" 7"'), mapper)
    assert [(e["gpu_index"], e["util_pct"]) for e in batches[0].events] == [(10, 90)]
    assert set(mapper.skipped) == {"gpu label missing or not 0-255"}


def test_a_byte_order_mark_is_no_part_of_the_first_name() -> None:
    """A page saved by a Windows tool, or a proxy that adds one: the first GPU's samples are kept, not renamed."""
    text = dcgm_text([Gpu(0, gpu_values(5), "h"), Gpu(1, gpu_values(7), "h")])
    assert parse_exposition("\ufeff" + text, TARGET) == parse_exposition(text, TARGET)
    bare = "\n".join(line for line in text.splitlines() if not line.startswith("#")) + "\n"  # no HELP line first
    assert [e["gpu_index"] for e in mapped("\ufeff" + bare)[0].events] == [0, 1]


def test_a_sample_older_than_the_mapper_remembers_is_refused_not_published_each_scrape() -> None:
    """A timestamp in seconds where the format has milliseconds (a hand-written exporter's ``1796000000``) parses as
    1970-01-21, and was published as that GPU's event time. A /federate that answers a series' last sample from
    long ago (VictoriaMetrics looks back a day) was published at every scrape: the GPU's last time is forgotten
    after an hour (STATE_TTL_S), so the same old sample was new again each time. Both are refused and counted."""
    mapper = DcgmMapper()
    lines = dcgm_text([Gpu(0, gpu_values(50), "h")]).splitlines()
    seconds = "".join(f"{line}\n" if line.startswith("#") else f"{line} {int(T)}\n" for line in lines)
    assert mapped(seconds, mapper) == []
    stale = dcgm_text([Gpu(0, gpu_values(50), "h", ts_ms=int((T - 20 * 3600) * 1000))])
    assert mapped(stale, mapper) == [] and mapped(stale, mapper, t=T + 30) == []
    assert mapper.skipped == {"sample timestamp not finite, over an hour behind or ahead of the scrape": 3}
    recent = dcgm_text([Gpu(0, gpu_values(50), "h", ts_ms=int((T - 300) * 1000))])  # Prometheus' 5-minute lookback
    assert [b.host.name for b in mapped(recent, mapper)] == ["h"]


_LABEL_NAMES = st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(lambda n: not n.startswith("__"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labels=st.dictionaries(_LABEL_NAMES, st.text(st.characters(exclude_categories=("Cs",)), max_size=20),
                              min_size=1, max_size=4),
       value=st.floats(), stamp=st.one_of(st.none(), st.integers(0, 2**53)))  # fmt: skip
def test_any_sample_the_text_format_allows_is_read_as_written(labels: dict[str, str], value: float,
                                                             stamp: int | None) -> None:  # fmt: skip
    """The text format's own bounds: a label value is any UTF-8 with ``\\``, ``"`` and newline escaped (U+2028, NEL,
    a tab or a lone CR as they are), the value any float (``NaN``, ``+Inf``), the timestamp int64 milliseconds."""
    escaped = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    body = ",".join(f'{k}="{v}"' for k, v in escaped.items())
    shown = "NaN" if math.isnan(value) else {math.inf: "+Inf", -math.inf: "-Inf"}.get(value, repr(value))
    line = f"DCGM_FI_DEV_GPU_UTIL{{{body}}} {shown}" + ("" if stamp is None else f" {stamp}")
    (sample,) = parse_exposition(f"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
                                 f"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n{line}\n", TARGET)  # fmt: skip
    assert sample.labels == labels
    assert sample.value == value or math.isnan(value) and math.isnan(sample.value)
    assert sample.timestamp == (None if stamp is None else stamp / 1000)


def test_a_line_longer_than_any_series_the_bridge_reads_is_left_out_and_counted() -> None:
    """kube-state-metrics exporting a pod's annotations whole (--metric-annotations-allowlist=pods=[*]: a last-applied
    configuration of JSON, each quote escaped), or a hostile target: prometheus-client's parser copies the value at
    each escaped quote, so one line of a MiB took it seconds and one of several MiB hours, holding the bridge's parse
    thread. A line over MAX_LINE_CHARS is left unparsed and counted; the samples around it are read as before."""
    from collections import Counter

    from detector.ingest.prometheus import LONG_LINE, MAX_LINE_CHARS

    annotation = '\\"k\\":' * (1 << 18)  # 1.5 MiB of escaped quotes
    text = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="h"} 37\n'
            f'kube_pod_annotations{{pod="p",annotation_last_applied="{annotation}"}} 1\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="h"} 38\n')  # fmt: skip
    assert len(annotation) > MAX_LINE_CHARS
    skipped: Counter[str] = Counter()
    samples = parse_exposition(text, "http://ksm:8080/metrics", skipped)
    assert [(s.name, s.labels["gpu"], s.value) for s in samples] == [("DCGM_FI_DEV_GPU_UTIL", "0", 37.0),
                                                                     ("DCGM_FI_DEV_GPU_UTIL", "1", 38.0)]  # fmt: skip
    assert skipped == {LONG_LINE: 1} and LONG_LINE == "line over 64 KiB (not parsed)"
    long_label = "x" * (MAX_LINE_CHARS - 100)  # under the bound: read as it is
    assert parse_exposition(f'kube_pod_labels{{label_a="{long_label}"}} 1\n', "ksm")[0].labels["label_a"] == long_label


def test_a_bad_line_after_a_long_one_is_named_by_its_own_line_number() -> None:
    """A line over MAX_LINE_CHARS left out, a bad line after it is still named by its number in the target's answer,
    as a person finds it there (``curl ... | sed -n 3p``). Before, the long line was removed from the text parsed,
    and every line after it was named by the number before it."""
    from collections import Counter

    from detector.ingest.prometheus import MAX_LINE_CHARS

    text = f'up 1\nkube_pod_annotations{{a="{"x" * (MAX_LINE_CHARS + 1)}"}} 1\nDCGM_FI_DEV_GPU_UTIL{{gpu="0" 37\n'
    with pytest.raises(ExpositionError) as caught:
        parse_exposition(text, "http://ksm:8080/metrics", Counter())
    assert "not Prometheus text at line 3 " in str(caught.value), caught.value
