"""The handover hooks with their collaborators faked (no broker, no store): ``WorkerParts.posts_recovered``
(``/healthz`` says null pending posts until it is true), and an assignment's taking over run beside the
consumer's rebalance, which a revocation ends before its own handover."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

from faust.types import TP

from streams.handover import Handover, alive_for, install_handover


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
        self.membership = None  # (outside a consumer group: held always)

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

    async def ask_store(self, look_up: Any, what: str, note: str, **options: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, look_up)  # a store that answers


async def _committed() -> None:
    pass


def _parts(outbox_assign: Any, releasing: Any = lambda holder, partitions: {}) -> SimpleNamespace:
    app = SimpleNamespace(on_partitions_revoked=_Signal(), on_partitions_assigned=_Signal(),
                          on_before_shutdown=_Signal(), conf=SimpleNamespace(broker_rebalance_timeout=60.0),
                          consumer=SimpleNamespace(commit=_committed))  # fmt: skip
    return SimpleNamespace(
        fetches=SimpleNamespace(clear=lambda: None),
        app=app, pipeline=_Pipeline(), outputs=None, actions=None, posts_recovered=False, assigned_states={},
        holds_partition_0=False,
        settings=SimpleNamespace(evict_after_s=0, dsn="chdb://memory", clickhouse_database="burnwatch", session_timeout_s=10),
        store=SimpleNamespace(states=SimpleNamespace(load=lambda partitions, horizon, latest, maybe_open: {}),
                              handovers=SimpleNamespace(mark=lambda holder, partitions, releasing: None,
                                                        releasing=releasing)),
        outbox=SimpleNamespace(assign=outbox_assign, revoke=lambda: None), alert_manager=lambda: None,
    )  # fmt: skip


def _assigned(partitions: list[int]) -> set[TP]:
    return {TP("gpu-metrics", p) for p in partitions}


def _assign(parts: SimpleNamespace, handover: Handover, partitions: list[int]) -> None:
    """The assignment's handler, then its taking over to its end."""

    async def run() -> None:
        await parts.app.on_partitions_assigned.receiver(None, _assigned(partitions))
        await handover.taken()

    asyncio.run(run())


def test_posts_are_recovered_once_an_assignment_has_taken_them() -> None:
    parts = _parts(lambda partitions: 0)
    handover = install_handover(parts)  # type: ignore[arg-type]
    assert parts.posts_recovered is False  # before the first assignment: not known
    _assign(parts, handover, [0, 1])
    assert parts.posts_recovered is True


def test_the_assignment_returns_while_its_taking_over_waits_and_a_revocation_ends_it_first() -> None:
    """The consumer sends no heartbeat until the assignment's handler returns, so the wait for a previous
    holder's handover runs beside it, as long as that handover lasts. A revocation meanwhile gives the
    taking over up before its own handover: nothing of the partitions is loaded or recovered."""
    asked = threading.Event()

    def releasing(holder: str, partitions: list[int]) -> dict[int, dict[str, float]]:
        asked.set()
        return {0: {"the previous holder": 1.0}}  # giving partition 0 up for a second, and not done

    order: list[str] = []
    parts = _parts(lambda partitions: order.append("recovered") or 0, releasing)
    parts.store.states.load = lambda partitions, horizon, latest, maybe_open: order.append("loaded") or {}
    parts.outbox.revoke = lambda: order.append("revoked")
    handover = install_handover(parts)  # type: ignore[arg-type]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(parts.app.on_partitions_assigned.receiver(None, _assigned([0])), 5)
        assert await loop.run_in_executor(None, asked.wait, 10)  # the taking over waits for the handover
        taking = handover.taking
        assert taking is not None and taking.task is not None and not taking.task.done()
        await parts.app.on_partitions_revoked.receiver(None, _assigned([0]))
        assert taking.task.done() and taking.given_up

    asyncio.run(run())
    assert order == ["revoked"] and parts.posts_recovered is False


def test_a_handover_marked_last_longer_ago_than_a_live_worker_marks_it_is_not_waited_for() -> None:
    """A worker killed during its handover stops marking it (every second while it lasts): once its last
    mark is older than the session timeout and a mark's bound (10 + 5 + 2 s here), the next holder goes
    ahead, rather than waiting out the rebalance timeout (60 s here)."""
    assert alive_for(10) == 10 + 5 + 2
    ages = {"killed": alive_for(10) + 1, "alive": alive_for(10) - 1}  # seconds since each one's latest mark

    for holder, waits in (("killed", False), ("alive", True)):
        parts = _parts(lambda partitions: 0, lambda _, partitions, h=holder: {0: {h: ages[h]}})
        handover = install_handover(parts)  # type: ignore[arg-type]

        async def run(parts: SimpleNamespace = parts, handover: Handover = handover) -> bool:
            await parts.app.on_partitions_assigned.receiver(None, _assigned([0]))
            try:
                await asyncio.wait_for(handover.taken(), 3)
            except TimeoutError:
                return True
            return False

        assert asyncio.run(run()) is waits, holder
        assert parts.posts_recovered is not waits


def test_a_revocation_during_the_posts_recovery_marks_its_handover_first_and_delivers_none() -> None:
    """The revocation's begin mark goes to the store before the taking over's step in progress (here the
    recovery of the posts) has ended, so that the next holder waits for it; and the posts recovered are
    not delivered (delivery is not woken): they are the next holder's."""
    in_assign, go_on = threading.Event(), threading.Event()
    order: list[str] = []

    def assign(partitions: list[int]) -> int:
        in_assign.set()
        go_on.wait(10)
        order.append("recovered")
        return 6

    parts = _parts(assign)
    parts.store.handovers.mark = lambda holder, partitions, releasing: order.append(f"marked releasing={releasing}")
    parts.outbox.revoke = lambda: order.append("revoked")
    install_handover(parts)  # type: ignore[arg-type]

    async def marked() -> None:
        while "marked releasing=True" not in order:
            await asyncio.sleep(0.01)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        await parts.app.on_partitions_assigned.receiver(None, _assigned([0]))
        assert await loop.run_in_executor(None, in_assign.wait, 10)  # the revocation comes during the recovery
        revoking = asyncio.ensure_future(parts.app.on_partitions_revoked.receiver(None, _assigned([0])))
        await asyncio.wait_for(marked(), 10)
        go_on.set()
        await asyncio.wait_for(revoking, 10)

    asyncio.run(run())
    assert order == ["marked releasing=True", "recovered", "revoked", "marked releasing=False"]
    assert not parts.pipeline.outbox_ready.is_set() and parts.posts_recovered is False


def test_a_handover_in_progress_is_marked_again_until_it_ends() -> None:
    """A revocation slower than the marks' refresh marks its partitions again while it lasts, then ends
    them: the next holder waits while the latest mark is recent, and not for a worker that died during it."""
    order: list[str] = []
    marked_again = threading.Event()

    def mark(holder: str, partitions: list[int], releasing: bool) -> None:
        order.append(f"marked releasing={releasing}")
        if order.count("marked releasing=True") >= 3:
            marked_again.set()

    parts = _parts(lambda partitions: 0)
    parts.settings.session_timeout_s = 0.4  # marked again every 0.1 s
    parts.store.handovers.mark = mark
    parts.outbox.revoke = lambda: marked_again.wait(10) and order.append("revoked")  # a slow revocation
    handover = install_handover(parts)  # type: ignore[arg-type]

    async def run() -> None:
        await parts.app.on_partitions_assigned.receiver(None, _assigned([0]))
        await handover.taken()
        await asyncio.wait_for(parts.app.on_partitions_revoked.receiver(None, _assigned([0])), 10)

    asyncio.run(run())
    assert marked_again.is_set()
    assert order[-2:] == ["revoked", "marked releasing=False"] and set(order[:-2]) == {"marked releasing=True"}


def _stop_while_the_outbox_recovers(outputs: Any = None) -> SimpleNamespace:
    """An assignment whose outbox recovery (six posts) a stop interrupts: the parts after both hooks."""
    in_assign, go_on = threading.Event(), threading.Event()

    def assign(partitions: list[int]) -> int:
        in_assign.set()
        go_on.wait(10)
        return 6

    parts = _parts(assign)
    parts.outputs = outputs
    handover = install_handover(parts)  # type: ignore[arg-type]

    async def run() -> None:
        loop = asyncio.get_running_loop()
        await parts.app.on_partitions_assigned.receiver(None, _assigned([0]))  # the taking over goes on beside it
        assert await loop.run_in_executor(None, in_assign.wait, 10)  # the stop comes during the recovery
        stopping = asyncio.ensure_future(parts.app.on_before_shutdown.receiver(None))
        while not parts.pipeline.stopping:  # the stop's hook has begun (it waits for the taking over to end)
            await asyncio.sleep(0)
        go_on.set()
        await asyncio.wait_for(stopping, 10)
        await handover.taken()

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
    _assign(fresh, install_handover(fresh), [0])  # type: ignore[arg-type]
    assert taken == [[0]] and fresh.posts_recovered is True
