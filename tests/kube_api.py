"""A local Kubernetes API server for the remediation tests: exactly the endpoints the
executors use, with the real paths, content types, Status bodies and status codes.

No lighter real API server exists to run in a test (a kind or k3s cluster needs
containers), so this speaks the part of the API the executors call, and records every
request so the tests can assert on what the real ``kubernetes`` client sent:

- ``GET /apis/apps/v1/namespaces/{ns}/deployments/{name}``
- ``GET|PATCH /apis/apps/v1/namespaces/{ns}/deployments/{name}/scale`` (an ``autoscaling/v1``
  Scale; PATCH as JSON patch, merge patch or strategic merge patch, as the API server accepts)
- ``GET|PATCH /apis/{group}/{version}/namespaces/{ns}/{plural}/{name}`` (custom objects:
  merge patch or JSON patch only; a strategic merge patch is refused with 415, as for any CRD)

A bearer token is required (401 otherwise); ``fail`` queues error answers and ``hang``
holds requests, for the failure paths.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

__all__ = ["KubeApi", "Received", "merge_patch"]

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_DEPLOYMENT = re.compile(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)(/scale)?")
_CUSTOM = re.compile(r"/apis/([^/]+)/([^/]+)/namespaces/([^/]+)/([^/]+)/([^/]+)")
_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 409: "Conflict",
            415: "UnsupportedMediaType", 422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
            503: "ServiceUnavailable"}  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902, the operations the tests need (add, replace, remove, test)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        node = doc
        for p in parents:
            node = node[p]
        if op["op"] in ("add", "replace"):
            node[last] = op["value"]
        elif op["op"] == "remove":
            del node[last]
        elif op["op"] == "test" and node.get(last) != op["value"]:
            raise ValueError(f"test failed at {op['path']}")
    return doc


@dataclass
class Received:
    """One request as the API server saw it."""

    method: str
    path: str
    query: str
    content_type: str
    body: Any
    authorization: str


@dataclass
class KubeApi:
    """The server's state: Deployments and custom objects by (namespace, name), and what it received."""

    token: str = "test-token-" + "k" * 24
    deployments: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    objects: dict[tuple[str, str, str, str, str], dict[str, Any]] = field(default_factory=dict)
    """(group, version, plural, namespace, name) -> the object."""
    received: list[Received] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    """Statuses to answer the next requests with, in order (after recording them)."""
    hang: threading.Event | None = None
    """When set to an Event, every request waits for it (up to 10 s) before being answered."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_deployment(self, namespace: str, name: str, replicas: int, owner: dict[str, Any] | None = None) -> None:
        labels = {"app": name}
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1",
                                "labels": labels}  # fmt: skip
        if owner:
            meta["ownerReferences"] = [{"apiVersion": owner.get("apiVersion", "serving.knative.dev/v1"), "kind": owner["kind"],
                                        "name": owner["name"], "uid": "uid-owner", "controller": True}]  # fmt: skip
        template = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "main", "image": "model:1"}]}}
        self.deployments[(namespace, name)] = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": template},
            "status": {"replicas": replicas, "readyReplicas": replicas},
        }  # fmt: skip

    def add_object(self, group: str, version: str, plural: str, namespace: str, name: str, kind: str,
                   spec: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> None:  # fmt: skip
        meta: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "1"}
        if annotations:
            meta["annotations"] = dict(annotations)
        self.objects[(group, version, plural, namespace, name)] = {
            "apiVersion": f"{group}/{version}", "kind": kind, "metadata": meta, "spec": spec or {}}  # fmt: skip

    def patches(self) -> list[Received]:
        return [r for r in self.received if r.method == "PATCH"]

    def kubeconfig(self, path: Path, url: str, context: str = "test") -> Path:
        """A kubeconfig that points at this server with its token."""
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": context,
            "clusters": [{"name": "local", "cluster": {"server": url}}],
            "users": [{"name": "burnwatch", "user": {"token": self.token}}],
            "contexts": [{"name": context, "context": {"cluster": "local", "user": "burnwatch"}}],
        }))  # fmt: skip
        return path

    # --- serving -------------------------------------------------------------------------

    def handle(self, method: str, path: str, query: str, headers: Any, raw: bytes) -> tuple[int, dict[str, Any]]:
        content_type = (headers.get("Content-Type") or "").split(";")[0].strip()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        with self.lock:
            self.received.append(Received(method, path, query, content_type, body, headers.get("Authorization") or ""))
            if headers.get("Authorization") != f"Bearer {self.token}":
                return _status(401, "Unauthorized")
            if self.failures:
                code = self.failures.pop(0)
                return _status(code, f"injected {_REASONS.get(code, 'error')}")
            if m := _DEPLOYMENT.fullmatch(path):
                return self._deployment(method, m.group(1), m.group(2), bool(m.group(3)), content_type, body)
            if m := _CUSTOM.fullmatch(path):
                group, version, namespace, plural, name = m.groups()
                return self._custom(method, (group, version, plural, namespace, name), content_type, body)
            return _status(404, "the server could not find the requested resource")

    def _deployment(self, method: str, ns: str, name: str, scale: bool, ctype: str, body: Any) -> tuple[int, dict[str, Any]]:
        dep = self.deployments.get((ns, name))
        if dep is None:
            return _status(404, f'deployments.apps "{name}" not found', name=name, kind="deployments")
        if not scale:
            return (200, dep) if method == "GET" else _status(405, "method not allowed here")
        if method == "PATCH":
            patched = _apply(self._scale_of(dep), ctype, body, strategic=True)
            if isinstance(patched, tuple):
                return patched
            replicas = patched.get("spec", {}).get("replicas")
            if not isinstance(replicas, int) or replicas < 0:
                return _status(422, f'Scale.autoscaling "{name}" is invalid: spec.replicas: Invalid value')
            dep["spec"]["replicas"] = replicas
            dep["status"] = {"replicas": replicas, "readyReplicas": replicas}
            dep["metadata"]["resourceVersion"] = str(int(dep["metadata"]["resourceVersion"]) + 1)
        elif method != "GET":
            return _status(405, "method not allowed here")
        return 200, self._scale_of(dep)

    @staticmethod
    def _scale_of(dep: dict[str, Any]) -> dict[str, Any]:
        meta = dep["metadata"]
        return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                             "resourceVersion": meta["resourceVersion"]},
                "spec": {"replicas": dep["spec"]["replicas"]},
                "status": {"replicas": dep["status"]["replicas"], "selector": f"app={meta['name']}"}}  # fmt: skip

    def _custom(self, method: str, key: tuple[str, str, str, str, str], ctype: str, body: Any) -> tuple[int, dict[str, Any]]:
        obj = self.objects.get(key)
        group, _, plural, _, name = key
        if obj is None:
            return _status(404, f'{plural}.{group} "{name}" not found', name=name, kind=plural)
        if method == "PATCH":
            patched = _apply(obj, ctype, body, strategic=False)
            if isinstance(patched, tuple):
                return patched
            patched["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
            self.objects[key] = obj = patched
        elif method != "GET":
            return _status(405, "method not allowed here")
        return 200, obj


def _apply(doc: dict[str, Any], ctype: str, body: Any, strategic: bool) -> dict[str, Any] | tuple[int, dict[str, Any]]:
    """The patched document, or the error the API server answers."""
    accepted = [JSON_PATCH, MERGE] + ([STRATEGIC] if strategic else []) + ["application/apply-patch+yaml"]
    if ctype not in accepted[:-1]:
        return _status(
            415, f"the body of the request was in an unknown format - accepted media types include: {', '.join(accepted)}"
        )
    if ctype == JSON_PATCH:
        if not isinstance(body, list):
            return _status(400, "json: cannot unmarshal object into Go value of type jsonpatch.Patch")
        try:
            return _json_patch(doc, body)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            return _status(422, f"the server rejected our request due to an error in our request: {exc}")
    if not isinstance(body, dict):
        return _status(400, "json: cannot unmarshal array into Go value of type map[string]interface {}")
    return merge_patch(doc, body)


def _status(code: int, message: str, **details: str) -> tuple[int, dict[str, Any]]:
    """A Kubernetes ``Status`` body, as the API server sends with an error."""
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
                            "reason": _REASONS.get(code, ""), "code": code}  # fmt: skip
    if details:
        body["details"] = details
    return code, body


class _Handler(BaseHTTPRequestHandler):
    api: KubeApi

    def _serve(self) -> None:
        path, _, query = self.path.partition("?")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.api.hang is not None:
            self.api.hang.wait(10)
        code, body = self.api.handle(self.command, path, query, self.headers, raw)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PATCH = do_POST = do_PUT = do_DELETE = _serve  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass


class Server:
    """``api`` served on 127.0.0.1 (a free port) in a thread until ``close``."""

    def __init__(self, api: KubeApi) -> None:
        handler = type("Handler", (_Handler,), {"api": api})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="kube-api", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
