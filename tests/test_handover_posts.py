"""``WorkerParts.posts_recovered`` (``/healthz`` says null pending posts until it is true) through the
handover hooks, with the hooks' collaborators faked: no broker, no store."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from streams.handover import install_handover


class _Signal:
    """A Faust signal as the hooks use it: ``connect`` keeps the receiver."""

    def __init__(self) -> None:
        self.receiver: Any = None

    def connect(self, receiver: Any) -> Any:
        self.receiver = receiver
        return receiver


class _Pipeline:
    def __init__(self) -> None:
        self.stopping = False
        self.stats = SimpleNamespace(partitions=0)
        self.outbox_ready, self.outputs_ready = asyncio.Event(), asyncio.Event()
        self.event_writer = SimpleNamespace(close=lambda: None)

    def stop(self) -> None:
        self.stopping = True

    async def pause(self) -> None:
        pass

    def reset(self) -> None:
        pass

    def expect(self, sources: Any) -> None:
        list(sources)

    def resume(self) -> bool:
        return not self.stopping


def _parts(outbox_assign: Any) -> SimpleNamespace:
    app = SimpleNamespace(on_partitions_revoked=_Signal(), on_partitions_assigned=_Signal(),
                          on_before_shutdown=_Signal(), conf=SimpleNamespace(broker_rebalance_timeout=60.0))  # fmt: skip
    return SimpleNamespace(
        app=app, pipeline=_Pipeline(), outputs=None, actions=None, posts_recovered=False, assigned_states={},
        holds_partition_0=False,
        settings=SimpleNamespace(evict_after_s=0, dsn="chdb://memory", clickhouse_database="burnwatch", session_timeout_s=10),
        store=SimpleNamespace(states=SimpleNamespace(load=lambda partitions, horizon, latest: {}),
                              handovers=SimpleNamespace(mark=lambda holder, partitions, releasing: None,
                                                        releasing=lambda holder, partitions: {})),
        outbox=SimpleNamespace(assign=outbox_assign, revoke=lambda: None), alert_manager=lambda: None,
    )  # fmt: skip


def _assigned(partitions: list[int]) -> set[TP]:
    return {TP("gpu-metrics", p) for p in partitions}


def test_posts_are_recovered_once_an_assignment_has_taken_them() -> None:
    parts = _parts(lambda partitions: 0)
    install_handover(parts)  # type: ignore[arg-type]
    assert parts.posts_recovered is False  # before the first assignment: not known
    asyncio.run(parts.app.on_partitions_assigned.receiver(None, _assigned([0, 1])))
    assert parts.posts_recovered is True


def _stop_while_the_outbox_recovers(outputs: Any = None) -> SimpleNamespace:
    """An assignment whose outbox recovery (six posts) a stop interrupts: the parts after both hooks."""
    in_assign, go_on = threading.Event(), threading.Event()

    def assign(partitions: list[int]) -> int:
        in_assign.set()
        go_on.wait(10)
        return 6

    parts = _parts(assign)
    parts.outputs = outputs
    install_handover(parts)  # type: ignore[arg-type]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        assigning = asyncio.ensure_future(parts.app.on_partitions_assigned.receiver(None, _assigned([0])))
        assert await loop.run_in_executor(None, in_assign.wait, 10)  # the stop comes during the recovery
        await parts.app.on_before_shutdown.receiver(None)
        go_on.set()
        await assigning

    asyncio.run(run())
    return parts


def test_a_stop_during_the_outboxs_recovery_leaves_the_posts_not_recovered() -> None:
    """A stop arrives while the outbox recovers the assignment's posts: the stop's hook revokes
    the outbox (its posts are left in the store for the next holder), so the assignment, finishing
    after it, must not say they are recovered (``/healthz`` would say 0 posts wait)."""
    parts = _stop_while_the_outbox_recovers()
    assert parts.pipeline.stopping and parts.posts_recovered is False


def test_a_stop_during_the_outboxs_recovery_leaves_the_other_outputs_unassigned() -> None:
    """The other outputs are taken after Slack's outbox: a stop that came meanwhile revokes them
    (or is about to), so the assignment does not take them, which would leave them owned, and
    delivering, through the shutdown while the next holder delivers them too."""
    taken: list[list[int]] = []
    outputs = SimpleNamespace(assign=lambda partitions: taken.append(partitions) or 0, revoke=lambda: None)
    parts = _stop_while_the_outbox_recovers(outputs)
    assert taken == [] and parts.posts_recovered is False
    fresh = _parts(lambda partitions: 0)  # a worker that no stop interrupts takes them
    fresh.outputs = outputs
    install_handover(fresh)  # type: ignore[arg-type]
    asyncio.run(fresh.app.on_partitions_assigned.receiver(None, _assigned([0])))
    assert taken == [[0]] and fresh.posts_recovered is True
