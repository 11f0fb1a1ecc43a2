"""The worker's web surface: ``/healthz``, ``/metrics``, ``/slack/actions``,
``/api/incidents`` and ``/incidents``, nothing else.

``/healthz`` answers 503 while the store takes no write (an orchestrator's readiness
probe); ``/metrics`` is Prometheus' text format; ``/slack/actions`` takes Slack's button
clicks, signed (:class:`detector.actions.RequestVerifier`); ``/api/incidents`` (JSON) and
``/incidents`` (a page) list incidents (:mod:`detector.incidents`), read through the
worker's own store connection, which is the only way to read an embedded store while the
worker holds it. The incident views ask for no credentials either (docs/incidents.md: put
them behind an authenticating proxy); with ``BURNWATCH_WEB_USER_HEADER`` naming the proxy's
header, the page's forms decide actions (``POST /incidents``, :mod:`detector.incidents_actions`).

Faust serves its own views on the same port: ``/router/`` and ``/table/`` (which
partition holds a key, and table contents), an index at ``/``, and with ``debug``
``/graph/``, ``/assignment/`` and statistics. None asks for credentials, and in a
container the port is reachable by everything that can reach Prometheus' target or
Slack's request URL. So Faust's views are switched off (its ``web_*_enabled``
settings) and, because Faust mounts at least its index whatever those say and a
later version may add more, every path but burnwatch's own is refused with 404
before any view runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import faust
import structlog
from aiohttp import web
from faust.types import TP
from faust.web import View

from detector.actions import ActionHandler, RequestVerifier
from detector.incidents import IncidentFilter, IncidentList, InvalidFilter, list_incidents
from detector.incidents_actions import PageTokens, WebDecisions, actions_of, cross_site, identity
from detector.incidents_page import HEADERS, render_error, render_page
from detector.metrics import METRICS
from detector.remediation.policy import Action
from detector.store import Connection
from detector.units import one_line
from streams.parts import WorkerParts

__all__ = ["INCIDENT_PATHS", "SERVED_PATHS", "IncidentViews", "SlackActionsView", "install_views", "serve_only_burnwatch"]

log = structlog.get_logger("burnwatch.web")

INCIDENT_PATHS = ("/api/incidents", "/incidents")
SERVED_PATHS = frozenset({"/healthz", "/metrics", "/slack/actions", *INCIDENT_PATHS})
_FAUST_VIEWS = ("web_router_enabled", "web_tables_enabled", "web_graph_enabled", "web_stats_enabled",
                "web_metrics_enabled")  # fmt: skip

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def serve_only_burnwatch(app: faust.App, paths: Iterable[str] = SERVED_PATHS) -> None:
    """Call right after creating the app, before any ``app.page``: turns Faust's own views
    off and refuses every path not in ``paths``."""
    for setting in _FAUST_VIEWS:
        setattr(app.conf, setting, False)
    server = getattr(app.web, "web_app", None)
    if not isinstance(server, web.Application):
        raise RuntimeError(f"unexpected Faust web driver {type(app.web).__name__}: cannot restrict its paths")
    allowed = frozenset(paths)

    @web.middleware
    async def only_burnwatch(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in allowed:
            return web.json_response({"error": "not found"}, status=404)
        return await handler(request)

    server.middlewares.append(only_burnwatch)


def install_views(parts: WorkerParts) -> None:
    """The views, and the gauges ``/metrics`` reads from the pipeline and the consumer."""
    _slack_actions(parts)
    _metrics(parts)
    _healthz(parts)
    _incidents(parts)


class IncidentViews:
    """``/api/incidents`` and ``/incidents`` as aiohttp handlers over a store connection. The
    query runs in the default executor (the web thread never blocks the event loop), on the
    connection the pipeline writes through: its lock serialises the two. The query string is
    checked first (:meth:`IncidentFilter.from_query`): a bad one is a 400 saying what is wrong,
    and a store that cannot answer is a 503, never a traceback.

    One query at a time: the store's lock has no fairness, so a loop of requests from anything
    that reaches the port could starve the pipeline's writes; a request while one is running
    is answered 429 with ``Retry-After: 1``.

    ``decisions`` and ``user_header`` (``BURNWATCH_WEB_USER_HEADER``) together let the person
    the proxy names decide actions from the page; without either, it is read-only and
    :meth:`decide` refuses every POST (403)."""

    def __init__(self, store: Connection, slack_workspace_url: str | None = None,
                 clock: Callable[[], float] = time.time, *, decisions: WebDecisions | None = None,
                 user_header: str | None = None, origin: str | None = None) -> None:  # fmt: skip
        self.store = store
        self.slack_workspace_url = slack_workspace_url
        self.clock = clock
        self.decisions = decisions
        self.user_header = user_header
        self.origin = origin
        self._querying = False
        """A query is in flight (the handlers all run on the web server's one event loop)."""

    def _busy(self, as_json: bool) -> web.Response | None:
        """The 429 for a request that comes while a query runs; None: go ahead (and mark busy)."""
        if self._querying:
            if as_json:
                return web.json_response({"error": "another incidents query is running; retry in a second"},
                                         status=429, headers={**_JSON_HEADERS, "Retry-After": "1"})  # fmt: skip
            response = _html(render_error(429, "Another incidents query is running; reload in a second."), 429)
            response.headers["Retry-After"] = "1"
            return response
        self._querying = True
        return None

    async def _list(self, flt: IncidentFilter) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, list_incidents, self.store, flt, self.clock())

    def _listed_with_actions(self, flt: IncidentFilter) -> tuple[IncidentList, dict[str, list[Action]]]:
        listed = list_incidents(self.store, flt, self.clock())
        return listed, actions_of(self.store, [i.alert_id for i in listed.incidents])

    async def api(self, request: web.Request) -> web.Response:
        """The incidents as JSON (docs/incidents.md): ``?open=1&team=T&limit=N``."""
        try:
            flt = IncidentFilter.from_query(_query(request))
        except InvalidFilter as exc:
            return web.json_response({"error": str(exc)}, status=400, headers=_JSON_HEADERS)
        busy = self._busy(as_json=True)
        if busy is not None:
            return busy
        try:
            listed = await self._list(flt)
        except Exception as exc:  # noqa: BLE001 - the store down or refusing: say so, keep serving
            log.warning("incidents_unavailable", error=one_line(exc))
            return web.json_response({"error": "the store did not answer; try again"}, status=503, headers=_JSON_HEADERS)
        finally:
            self._querying = False
        return web.json_response(listed.to_json(self.slack_workspace_url), headers=_JSON_HEADERS)

    async def page(self, request: web.Request) -> web.Response:
        """The open incidents as a page, highest dollars per hour first: ``?team=T&limit=N``."""
        try:
            flt = IncidentFilter.from_query(_query(request), allowed=("team", "limit", "offset"), open_only=True)
        except InvalidFilter as exc:
            return _html(render_error(400, str(exc)), 400)
        busy = self._busy(as_json=False)
        if busy is not None:
            return busy
        try:
            loop = asyncio.get_running_loop()
            listed, actions = await loop.run_in_executor(None, self._listed_with_actions, flt)
        except Exception as exc:  # noqa: BLE001 - as in api()
            log.warning("incidents_unavailable", error=one_line(exc))
            return _html(render_error(503, "The store did not answer; try again."), 503)
        finally:
            self._querying = False
        user = identity(request.headers, self.user_header)
        token = self.decisions.tokens.issue(user) if user is not None and self.decisions is not None else None
        return _html(render_page(listed, self.slack_workspace_url, actions, user=user, token=token), 200)

    async def decide(self, request: web.Request) -> web.Response:
        """A decision from the page's form: 303 back to the page when taken; 403 when actions
        are off here, nobody is named, the request is not the page's or the person may not
        decide (recorded); 409 when nothing awaits a decision (a second click)."""
        if self.decisions is None or not self.user_header:
            return _html(render_error(403, "Actions are not decided from this page here "
                                           "(BURNWATCH_WEB_USER_HEADER is not set, or actions are off)."), 403)  # fmt: skip
        user = identity(request.headers, self.user_header)
        if user is None:
            return _html(render_error(403, f"No person named by the proxy ({self.user_header})."), 403)
        why = cross_site(request.headers, request.host, self.origin)
        if why is not None:
            log.warning("web_action_refused", user=user, reason=why)
            return _html(render_error(403, why, back=True), 403)
        if (request.content_length or 0) > _MAX_FORM or request.content_type != "application/x-www-form-urlencoded":
            return _html(render_error(400, "Not the page's form."), 400)
        form = await request.post()
        fields = {name: [str(v) for v in form.getall(name)] for name in form}
        loop = asyncio.get_running_loop()
        try:
            status, what = await loop.run_in_executor(None, self.decisions.handle, user, fields)
        except Exception as exc:  # noqa: BLE001 - the store down: nothing was decided, say so
            log.warning("web_action_failed", user=user, error=one_line(exc))
            return _html(render_error(503, "The store did not answer; nothing was decided. Try again.", back=True), 503)
        if status == 200:
            return web.Response(status=303, headers={**HEADERS, "Location": "incidents"})  # the page again, GET
        return _html(render_error(status, what, back=True), status)


_MAX_FORM = 4096
_JSON_HEADERS = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def _query(request: web.Request) -> dict[str, list[str]]:
    return {name: request.query.getall(name) for name in request.query}


def _html(body: str, status: int) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/html", charset="utf-8", headers=HEADERS)


def _incidents(parts: WorkerParts) -> None:
    settings = parts.settings
    secret = settings.web_token_secret
    tokens = PageTokens(secret.get_secret_value().encode() if secret else None)
    decisions = (WebDecisions(parts.store, parts.actions, tokens, outbox=parts.outbox)
                 if settings.web_user_header and parts.actions is not None else None)  # fmt: skip
    views = IncidentViews(parts.store, settings.slack_workspace_url, decisions=decisions,
                          user_header=settings.web_user_header, origin=settings.web_origin)  # fmt: skip

    @parts.app.page("/api/incidents")
    class IncidentsApi(View):
        """The incident list as JSON."""

        async def get(self, request: Any, **kwargs: Any) -> Any:
            return await views.api(request)

    @parts.app.page("/incidents")
    class IncidentsPage(View):
        """The open incidents as a page; its forms post decisions here."""

        async def get(self, request: Any, **kwargs: Any) -> Any:
            return await views.page(request)

        async def post(self, request: Any, **kwargs: Any) -> Any:
            return await views.decide(request)


class SlackActionsView:
    """``/slack/actions`` as an aiohttp handler: the request's body and headers go to the
    :class:`ActionHandler` in the default executor (it reads and writes the store and may
    call Slack); its (status, JSON) is the answer. None: no signing secret, every click refused."""

    def __init__(self, actions: ActionHandler | None) -> None:
        self.actions = actions

    async def post(self, request: web.Request) -> web.Response:
        if self.actions is None:
            return web.json_response({"error": "Slack actions are not configured (SLACK_SIGNING_SECRET)"}, status=404,
                                     headers=_JSON_HEADERS)  # fmt: skip
        body = await request.read()
        headers = dict(request.headers)
        loop = asyncio.get_running_loop()
        status, answer = await loop.run_in_executor(None, self.actions.handle, body, headers)
        return web.json_response(answer, status=status, headers=_JSON_HEADERS)


def _slack_actions(parts: WorkerParts) -> None:
    secret = parts.settings.slack_signing_secret
    outbox = parts.outbox
    actions = (ActionHandler(RequestVerifier(secret.get_secret_value()), parts.store, outbox.notifier, outbox,
                             remediation=parts.actions, response_origin=parts.settings.slack_base_url)
               if secret else None)  # fmt: skip
    view = SlackActionsView(actions)

    @parts.app.page("/slack/actions")
    class SlackActions(View):
        """Slack's interactivity endpoint: Acknowledge, Snooze 24h, Mark as expected; Approve
        and Decline on an action's message."""

        async def post(self, request: Any, **kwargs: Any) -> Any:
            return await view.post(request)


def _metrics(parts: WorkerParts) -> None:
    app, pipeline, engine = parts.app, parts.pipeline, parts.engine

    def consumer_lag() -> list[tuple[str, int, int]]:
        out = []
        for (topic, partition), next_offset in list(pipeline.positions.items()):
            highwater = app.consumer.highwater(TP(topic, partition))
            if highwater is not None:
                out.append((topic, partition, max(0, highwater - next_offset)))
        return out

    METRICS.stalled_seconds.set_function(pipeline.stalled_for)
    METRICS.keys_held.set_function(lambda: len(engine))
    METRICS.keys_evicted.set_function(lambda: engine.evicted)
    METRICS.partitions.set_function(lambda: pipeline.stats.partitions)
    METRICS.rules_refused.set_function(lambda: 1 if parts.config.refused is not None else 0)
    outbox = parts.outbox
    METRICS.slack_channels_refusing.set_function(lambda: len(outbox.notifier.refusing) if outbox.notifier else 0)
    METRICS.watch(lag=consumer_lag, watermark=lambda: engine.watermark, detector_errors=lambda: dict(engine.errors))

    @app.page("/metrics")
    async def metrics(web: Any, request: Any) -> Any:
        """Prometheus text exposition of :mod:`detector.metrics`."""
        return web.bytes(METRICS.render(), content_type="text/plain; version=0.0.4")


def _healthz(parts: WorkerParts) -> None:
    pipeline, engine, outbox, config = parts.pipeline, parts.engine, parts.outbox, parts.config
    membership = pipeline.membership

    @parts.app.page("/healthz")
    async def healthz(web: Any, request: Any) -> Any:
        s = pipeline.stats
        stalled = pipeline.stalled_for()
        return web.json(
            {
                "status": "stalled" if stalled else "ok",
                "stalled_s": round(stalled, 1),
                "stall_reason": pipeline.stall_reason or None,
                "holding_watermark": {f"{t}/{p}": why for (t, p), why in pipeline.holding.items()},
                # several workers: how long the others' stored progress has held this one's release back
                "held_by_other_workers_s": round(pipeline.group.held_s(), 1) if pipeline.group is not None else 0.0,
                "partitions": s.partitions,
                # "unconfirmed" after a freeze past the group's session: nothing is written or posted until
                # a heartbeat says the group holds this worker still, or a revocation finds it dropped ("lost")
                "membership": membership.status() if membership is not None else "held",
                "writes_awaiting_membership": membership.waiting if membership is not None else 0,
                "messages": s.messages,
                "batches": s.batches,
                "events": s.events,
                "detected": s.detected,
                "held": len(pipeline.aligner),
                "keys_held": len(engine),
                "keys_evicted": engine.evicted,
                "read_ahead": s.read_ahead,
                "watermark": engine.watermark,
                "fetch_paused": len(pipeline.paused),
                "fetch_pauses": s.fetch_pauses,
                "dead_letters": s.dead_letters,
                "detector_errors": engine.errors,
                # the rule files on disk refused (their errors): the rules in force are older, a start would fail
                "rules_refused": "; ".join(map(str, refused.errors)) if (refused := config.refused) else None,
                "alerts_fired": s.alerts_fired,
                "alerts_resolved": s.alerts_resolved,
                # null while the posts the partitions' previous holder left in the store are being
                # recovered: "0" then would tell an operator (or a test) that nothing waits
                "slack_pending": parts.slack_pending,
                "slack_delivered": outbox.delivered,
                # channels whose last post Slack refused for good, and the fix: a routed one's alerts go to
                # SLACK_CHANNEL meanwhile; SLACK_CHANNEL's own are recorded refused, posted nowhere
                "slack_refusing": dict(outbox.notifier.refusing) if outbox.notifier is not None else {},
                "outputs_pending": parts.outputs_pending,
                "outputs_delivered": parts.outputs.delivered if parts.outputs is not None else 0,
            },
            status=503 if stalled else 200,
        )
