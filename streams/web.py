"""The worker's web surface: ``/healthz``, ``/metrics`` and ``/slack/actions``, nothing else.

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

from collections.abc import Awaitable, Callable, Iterable

import faust
from aiohttp import web

__all__ = ["SERVED_PATHS", "serve_only_burnwatch"]

SERVED_PATHS = frozenset({"/healthz", "/metrics", "/slack/actions"})
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
