"""``cull_notebook`` on JupyterHub: stop the user's server through the hub's REST API.

``DELETE {api}/users/{name}/server`` (``/users/{name}/servers/{server}`` for a named
server), as the JupyterHub idle culler does, with a token that has the ``servers`` scope
(``Authorization: token ...``). The server stops; the user, their home and their named
servers' definitions stay, and they start it again from the hub's home page.

Where the name comes from: JupyterHub on Kubernetes (KubeSpawner) labels its user pods
``hub.jupyter.org/username`` and ``hub.jupyter.org/servername``, which the alert's pods carry
when kube-state-metrics exports them; elsewhere a tag of the alerted resource named by
``user_tag``. A name is put in the URL only when it is a plausible username (no ``/``, no
control characters, bounded length) and then percent-quoted.

The hub URL is ``JUPYTERHUB_API_URL`` (``http://hub:8081/hub/api``, as the hub gives its
services) and the token ``JUPYTERHUB_API_TOKEN``, both read from the environment when the
call is made; the token never enters a :class:`Call`, a log line or an outcome.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

import urllib3

from detector.remediation.base import ActionKind, Call, NotApplicable, Outcome, Target
from detector.remediation.workloads import PodRef, only, pod_labels, pods_of, shown

__all__ = ["API", "SERVER_LABEL", "USER_LABEL", "JupyterHubCuller", "plausible_username"]

USER_LABEL = "hub.jupyter.org/username"
SERVER_LABEL = "hub.jupyter.org/servername"
API = "jupyterhub.DELETE /users/{name}/server"
API_NAMED = "jupyterhub.DELETE /users/{name}/servers/{server_name}"
_USERNAME = re.compile(r"[\w][\w.@+=~-]*")
"""Letters (any script), digits and the punctuation usernames and e-mail addresses use; not
``/``, ``%``, ``?``, ``#``, whitespace or control characters."""
MAX_USERNAME = 255
TIMEOUT = urllib3.Timeout(connect=5.0, read=20.0)


def plausible_username(value: object) -> bool:
    """Whether ``value`` can be a JupyterHub user or server name and nothing more."""
    return (isinstance(value, str) and 0 < len(value) <= MAX_USERNAME and _USERNAME.fullmatch(value) is not None
            and ".." not in value)  # fmt: skip


def _api_url(value: str) -> str:
    parts = urlsplit(value)
    if "@" in parts.netloc:  # checked first: the error must not quote the password either
        raise ValueError("JupyterHub API URL has a user or password in it: the hub's credential is the token "
                         "(JUPYTERHUB_API_TOKEN), and the URL is recorded with every call")  # fmt: skip
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise ValueError(f"JupyterHub API URL {value!r} is not http(s)://host[:port]/path (e.g. http://hub:8081/hub/api)")
    return value.rstrip("/")


class JupyterHubCuller:
    """Stops a JupyterHub user's server."""

    kind: ClassVar[ActionKind] = "cull_notebook"

    def __init__(self, api_url: str | None = None, user_tag: str | None = None, server_tag: str | None = None,
                 token_env: str = "JUPYTERHUB_API_TOKEN") -> None:  # fmt: skip
        """``api_url``: the hub's API (default ``$JUPYTERHUB_API_URL``); ``user_tag``/``server_tag``: the
        target's tags that name the user and server when its pods do not."""
        url = api_url if api_url is not None else os.environ.get("JUPYTERHUB_API_URL", "")
        self.api_url = _api_url(url) if url else ""
        self.user_tag = user_tag
        self.server_tag = server_tag
        self.token_env = token_env
        self._http = urllib3.PoolManager(timeout=TIMEOUT, retries=False)

    def applies(self, target: Target) -> bool:
        """Whether the target names a JupyterHub user at all (its pods' label or the tag)."""
        if self.user_tag and self.user_tag in target.tags:
            return True
        return any(USER_LABEL in labels for labels in pod_labels(target))

    def plan(self, target: Target) -> Call:
        if not self.api_url:
            raise NotApplicable("no JupyterHub to call: set JUPYTERHUB_API_URL")
        user, server = self._names(target)
        if not plausible_username(user):
            raise NotApplicable(f"{shown(user)} is not a plausible JupyterHub username")
        if server and not plausible_username(server):
            raise NotApplicable(f"{shown(server)} is not a plausible JupyterHub server name")
        return Call(api=API_NAMED if server else API, request={"user": user, "server": server}, endpoint=self.api_url)

    def _names(self, target: Target) -> tuple[str, str]:
        if self.user_tag and self.user_tag in target.tags:
            server = target.tags.get(self.server_tag, "") if self.server_tag else ""
            return target.tags[self.user_tag], server
        pods = pods_of(target)
        users = [p for p in pods if USER_LABEL in p.labels]
        if not users:
            raise NotApplicable(f"no pod of the alert has the {USER_LABEL} label (JupyterHub on Kubernetes sets it)")
        if len(users) < len(pods):
            others = [p.where for p in pods if USER_LABEL not in p.labels]
            raise NotApplicable(f"pods {', '.join(others[:3])} are not JupyterHub servers: stopping one would not free the GPUs")
        pod: PodRef = only(users, lambda p: (p.labels[USER_LABEL], p.labels.get(SERVER_LABEL, "")), "JupyterHub server")
        if pod.kind:
            raise NotApplicable(
                f"{pod.where} is run by {pod.kind}/{pod.name}, not spawned by JupyterHub (whose pods have no controller)"
            )
        return pod.labels[USER_LABEL], pod.labels.get(SERVER_LABEL, "")

    def execute(self, call: Call) -> Outcome:
        user, server = call.request.get("user"), call.request.get("server") or ""
        # The call may come back from the audit table: check it again before it becomes a URL.
        if not plausible_username(user) or not isinstance(server, str) or (server and not plausible_username(server)):
            return Outcome(ok=False, detail=f"refused: {shown(user)}/{shown(server)} is not a plausible user/server name")
        assert isinstance(user, str) and isinstance(server, str)
        # a Secret made from a file often ends in a newline: dropped. Anything else not printable would make
        # http.client raise ValueError quoting the header, token included: refused here, never shown.
        token = os.environ.get(self.token_env, "").strip()
        if not token:
            return Outcome(ok=False, detail=f"no JupyterHub token: set {self.token_env}")
        if not token.isprintable() or any(c.isspace() for c in token):
            return Outcome(ok=False, detail=f"{self.token_env} holds spaces or control characters: not a token (not shown)")
        if not self.api_url:
            return Outcome(ok=False, detail="no JupyterHub to call: set JUPYTERHUB_API_URL")
        if call.endpoint and call.endpoint != self.api_url:  # the token goes only to the configured hub
            return Outcome(ok=False, detail=f"refused: planned for another hub ({shown(call.endpoint)})")
        path = f"/users/{quote(user, safe='')}/server" + (f"s/{quote(server, safe='')}" if server else "")
        who = f"{user}'s server {server!r}" if server else f"{user}'s server"
        try:
            resp = self._http.request("DELETE", self.api_url + path, headers={"Authorization": f"token {token}"},
                                      redirect=False)  # fmt: skip
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return Outcome(ok=False, detail=f"stopping {who}: {type(exc).__name__}: {_line(str(exc))}", retryable=True)
        return _outcome(resp.status, _message(resp.data), who)


def _outcome(status: int, message: str, who: str) -> Outcome:
    """What the hub's answer means. 204: stopped; 202: stopping (the hub finishes it); 400 saying
    the server is not running (hubs before 5.0): already stopped, as asked; 400 while it starts
    or stops: try again later; 404: no such user or server (or the token may not see them)."""
    if status == 204:
        return Outcome(ok=True, detail=f"stopped {who}")
    if status == 202:
        return Outcome(ok=True, detail=f"stopping {who} (the hub accepted; it finishes in the background)")
    said = f": {message}" if message else ""
    if status == 400 and "not running" in message:
        return Outcome(ok=True, detail=f"{who} was not running{said}", saves=False)
    if status == 400 and ("pending" in message or "please wait" in message):
        return Outcome(ok=False, detail=f"{who} is starting or stopping (HTTP 400{said})", retryable=True)
    if status == 404:
        return Outcome(ok=False, detail=f"the hub has no such user or server, or the token cannot see it: {who} (HTTP 404{said})")
    if status in (401, 403):
        return Outcome(ok=False, detail=f"the hub refused the token for {who} (HTTP {status}{said}): "
                                        "it needs the delete:servers scope")  # fmt: skip
    return Outcome(ok=False, detail=f"stopping {who}: HTTP {status}{said}", retryable=status == 429 or status >= 500)


def _message(body: bytes) -> str:
    """The ``message`` of the hub's JSON error body, on one short line."""
    text = body.decode("utf-8", "replace")
    try:
        parsed: Any = json.loads(text)
        if isinstance(parsed, dict) and isinstance(parsed.get("message"), str):
            text = parsed["message"]
    except ValueError:
        pass
    return _line(text)


def _line(text: str) -> str:
    return " ".join(text.split())[:300]
