"""Local servers for stop_instance on Compute Engine and Azure: exactly the REST paths the
executors' SDK clients use, with the providers' bodies, status codes and long-running
operation headers, recording every request so tests assert on what the real clients sent.

No local server of either API exists to pip-install (moto covers AWS only), so these speak
the part the executors call:

Compute Engine (``compute/v1``, JSON):
- ``POST /compute/v1/projects/{p}/zones/{z}/instances/{instance}/stop``: a zone Operation
  (``RUNNING``; the instance goes ``STOPPING``)
- ``POST /compute/v1/projects/{p}/zones/{z}/operations/{op}/wait``: the Operation ``DONE``
  (the instance ``TERMINATED``)
- ``GET /compute/v1/projects/{p}/zones/{z}/instances/{instance}``: the Instance
  (``{instance}`` is its name or its numeric id, as the API accepts), errors as Google's
  ``{"error": {"code", "message", "errors": [{"reason"}]}}``.

Azure Resource Manager (over HTTPS with a self-signed certificate: azure-core sends a bearer
token over TLS only), path segments compared without case, as ARM does:
- ``POST /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{vm}/deallocate?api-version=V``:
  202 with ``Azure-AsyncOperation``, ``Location`` and ``Retry-After``
- ``GET .../providers/Microsoft.Compute/locations/{loc}/operations/{id}``: ``{"status": "InProgress"}``
  for ``polls_in_progress`` polls, then ``Succeeded`` (or ``Failed`` with ARM's error); with
  ``?monitor=true`` (the ``Location`` URL), 202 until done, then 200 with no body
- ``GET .../virtualMachines/{vm}``: the VM (with ``$expand=instanceView``, its power state too);
  ``GET .../virtualMachines/{vm}/instanceView``: the power state.

``fail`` queues error answers and ``hang`` holds requests, for the failure paths.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["AzureApi", "GceApi", "Received", "Server", "self_signed"]


@dataclass
class Received:
    """One request as the server saw it."""

    method: str
    path: str
    query: str
    body: bytes
    headers: dict[str, str]


@dataclass
class _Api:
    received: list[Received] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    """Statuses to answer the next requests with, in order (after recording them)."""
    pass_first: int = 0
    """How many requests are answered normally before ``failures`` apply (to fail a poll, not the call)."""
    hang: threading.Event | None = None
    """When set to an Event, every request waits for it (up to 10 s) before being answered."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, method: str, path: str, query: str, headers: Any, raw: bytes) -> tuple[int, dict[str, str], Any]:
        raise NotImplementedError

    def posts(self) -> list[Received]:
        return [r for r in self.received if r.method == "POST"]


# --- Compute Engine ----------------------------------------------------------------------

_GCE_ZONE = r"/compute/v1/projects/([^/]+)/zones/([^/]+)"
_GCE_INSTANCE = re.compile(_GCE_ZONE + r"/instances/([^/]+)(/stop)?")
_GCE_WAIT = re.compile(_GCE_ZONE + r"/operations/([^/]+)/wait")
_GCE_REASONS = {400: "badRequest", 401: "required", 403: "forbidden", 404: "notFound", 409: "conflict",
                429: "rateLimitExceeded", 500: "backendError", 503: "backendError"}  # fmt: skip


@dataclass
class GceApi(_Api):
    """Instances by (project, zone, name) -> {"id", "status"}; operations by name."""

    instances: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    operation_error: dict[str, Any] | None = None
    """When set, a stop's Operation comes back DONE with this ``error`` (and HTTP error fields)."""
    waits_running: int = 0
    """How many ``wait`` calls answer the operation still RUNNING (as the API does after ~2 minutes),
    each after 0.1 s, before it is DONE."""

    def add(self, project: str, zone: str, name: str, numeric_id: str, status: str = "RUNNING",
            created_by: str = "") -> None:  # fmt: skip
        """``created_by``: the ``created-by`` metadata GCE sets on a managed instance group's instances."""
        self.instances[(project, zone, name)] = {"id": numeric_id, "status": status, "created_by": created_by}

    def status(self, project: str, zone: str, name: str) -> str:
        return str(self.instances[(project, zone, name)]["status"])

    def _find(self, project: str, zone: str, ident: str) -> tuple[str, dict[str, Any]] | None:
        for (p, z, name), inst in self.instances.items():
            if (p, z) == (project, zone) and ident in (name, inst["id"]):
                return name, inst
        return None

    def handle(self, method: str, path: str, query: str, headers: Any, raw: bytes) -> tuple[int, dict[str, str], Any]:
        with self.lock:
            self.received.append(Received(method, path, query, raw, dict(headers.items())))
            if self.failures and len(self.received) > self.pass_first:
                code = self.failures.pop(0)
                return _gce_error(code, f"injected {_GCE_REASONS.get(code, 'error')}")
            if (m := _GCE_WAIT.fullmatch(path)) and method == "POST":
                project, zone, op = m.groups()
                operation = self.operations.get(op)
                if operation is None or operation["zone"].rsplit("/", 1)[-1] != zone:
                    return _gce_error(404, f"The resource 'projects/{project}/zones/{zone}/operations/{op}' was not found")
                if operation["status"] != "DONE" and self.waits_running > 0:
                    self.waits_running -= 1
                    self.lock.release()
                    try:
                        time.sleep(0.1)
                    finally:
                        self.lock.acquire()
                    return 200, {}, operation
                if operation["status"] != "DONE":
                    operation.update(status="DONE", progress=100)
                    found = self._find(project, zone, operation["targetId"])
                    if found:
                        found[1]["status"] = "TERMINATED"
                return 200, {}, operation
            if m := _GCE_INSTANCE.fullmatch(path):
                project, zone, ident, stop = m.groups()
                found = self._find(project, zone, ident)
                if found is None:
                    return _gce_error(404, f"The resource 'projects/{project}/zones/{zone}/instances/{ident}' was not found")
                name, inst = found
                if not stop and method == "GET":
                    return 200, {}, self._instance(project, zone, name, inst)
                if stop and method == "POST":
                    return 200, {}, self._stop(project, zone, name, inst)
                return _gce_error(405, "method not allowed")
            return _gce_error(404, "Not Found")

    def _instance(self, project: str, zone: str, name: str, inst: dict[str, Any]) -> dict[str, Any]:
        link = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
        items = [{"key": "created-by", "value": inst["created_by"]}] if inst.get("created_by") else []
        return {"kind": "compute#instance", "id": inst["id"], "name": name, "status": inst["status"],
                "zone": link, "selfLink": f"{link}/instances/{name}",
                "metadata": {"kind": "compute#metadata", "fingerprint": "x2kGcmW8Wg4=",
                             "items": [{"key": "startup-script", "value": "#!/bin/sh"}, *items]}}  # fmt: skip

    def _stop(self, project: str, zone: str, name: str, inst: dict[str, Any]) -> dict[str, Any]:
        op = f"operation-{len(self.operations) + 1}-5f3c2a-stop"
        link = f"https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}"
        operation: dict[str, Any] = {
            "kind": "compute#operation", "id": str(7000 + len(self.operations)), "name": op, "zone": link,
            "operationType": "stop", "targetLink": f"{link}/instances/{name}", "targetId": inst["id"],
            "status": "RUNNING", "progress": 0, "user": "burnwatch@example.iam.gserviceaccount.com",
            "selfLink": f"{link}/operations/{op}",
        }  # fmt: skip
        if self.operation_error is not None:
            operation.update(status="DONE", progress=100, error=self.operation_error, httpErrorStatusCode=400,
                             httpErrorMessage="BAD REQUEST")  # fmt: skip
        elif inst["status"] in ("RUNNING", "STAGING", "PROVISIONING"):
            inst["status"] = "STOPPING"
        self.operations[op] = operation
        return operation


def _gce_error(code: int, message: str) -> tuple[int, dict[str, str], Any]:
    reason = _GCE_REASONS.get(code, "error")
    return code, {}, {"error": {"code": code, "message": message,
                                "errors": [{"message": message, "domain": "global", "reason": reason}]}}  # fmt: skip


# --- Azure Resource Manager --------------------------------------------------------------

_ARM_VM = re.compile(r"/subscriptions/([^/]+)/resourceGroups/([^/]+)/providers/Microsoft\.Compute/virtualMachines/([^/]+)"
                     r"(?:/(deallocate|instanceView))?", re.IGNORECASE)  # fmt: skip
_ARM_OPERATION = re.compile(r"/subscriptions/([^/]+)/providers/Microsoft\.Compute/locations/([^/]+)/operations/([^/]+)",
                            re.IGNORECASE)  # fmt: skip
_ARM_CODES = {400: "BadRequest", 401: "AuthenticationFailed", 403: "AuthorizationFailed", 404: "ResourceNotFound",
              409: "OperationNotAllowed", 429: "TooManyRequests", 500: "InternalServerError",
              503: "ServiceUnavailable"}  # fmt: skip


@dataclass
class AzureApi(_Api):
    """VMs by (subscription, resource group, name), compared without case -> power state; operations by id."""

    token: str = "test-token-" + "a" * 24
    base_url: str = ""
    """Set by the test once the server listens: the async-operation URLs point back at it."""
    vms: dict[tuple[str, str, str], str] = field(default_factory=dict)
    scale_sets: dict[tuple[str, str, str], str] = field(default_factory=dict)
    """The scale set (its ARM id) of each VM that is a Flexible scale set's instance."""
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    polls_in_progress: int = 1
    """How many polls of an operation answer InProgress before it ends."""
    operation_error: dict[str, str] | None = None
    """When set, operations end Failed with this error."""
    api_versions: list[str] = field(default_factory=list)

    def add(self, subscription: str, group: str, name: str, power: str = "running", scale_set: str = "") -> None:
        self.vms[(subscription.lower(), group.lower(), name.lower())] = power
        if scale_set:
            self.scale_sets[(subscription.lower(), group.lower(), name.lower())] = scale_set

    def power(self, subscription: str, group: str, name: str) -> str:
        return self.vms[(subscription.lower(), group.lower(), name.lower())]

    def handle(self, method: str, path: str, query: str, headers: Any, raw: bytes) -> tuple[int, dict[str, str], Any]:
        with self.lock:
            self.received.append(Received(method, path, query, raw, dict(headers.items())))
            if headers.get("Authorization") != f"Bearer {self.token}":
                return _arm_error(401, "The access token is missing or invalid.")
            if self.failures and len(self.received) > self.pass_first:
                code = self.failures.pop(0)
                return _arm_error(code, f"injected {_ARM_CODES.get(code, 'error')}")
            if "api-version=" not in query:
                return _arm_error(400, "The api-version query parameter (?api-version=) is required for all requests.")
            if m := _ARM_VM.fullmatch(path):
                sub, group, name, verb = m.groups()
                key = (sub.lower(), group.lower(), name.lower())
                if key not in self.vms:
                    return _arm_error(404, f"The Resource 'Microsoft.Compute/virtualMachines/{name}' under resource "
                                           f"group '{group}' was not found.")  # fmt: skip
                if verb is None and method == "GET":  # the VM, as ARM's GET answers (the fields read here)
                    properties: dict[str, Any] = {"vmId": "0f9e8d7c-0000-4000-8000-000000000001",
                                                  "provisioningState": "Succeeded"}  # fmt: skip
                    if key in self.scale_sets:
                        properties["virtualMachineScaleSet"] = {"id": self.scale_sets[key]}
                    if "%24expand=instanceView" in query or "$expand=instanceView" in query:
                        properties["instanceView"] = self._instance_view(key)
                    return 200, {}, {"id": path, "name": name, "type": "Microsoft.Compute/virtualMachines",
                                     "location": "eastus", "properties": properties}  # fmt: skip
                if verb is None:
                    return _arm_error(405, "The requested resource does not support this method.")
                if verb.lower() == "deallocate" and method == "POST":
                    return self._deallocate(sub, key)
                if verb.lower() == "instanceview" and method == "GET":
                    return 200, {}, self._instance_view(key)
                return _arm_error(405, "The requested resource does not support this method.")
            if (m := _ARM_OPERATION.fullmatch(path)) and method == "GET":
                return self._poll(m.group(3), monitor="monitor=true" in query)
            return _arm_error(404, "The requested resource was not found.")

    def _instance_view(self, key: tuple[str, str, str]) -> dict[str, Any]:
        return {"statuses": [{"code": "ProvisioningState/succeeded", "level": "Info"},
                             {"code": f"PowerState/{self.vms[key]}", "level": "Info"}]}  # fmt: skip

    def _deallocate(self, sub: str, key: tuple[str, str, str]) -> tuple[int, dict[str, str], Any]:
        op = f"6a1f0c2e-0d4b-4c55-9a7e-{len(self.operations) + 1:012d}"
        self.operations[op] = {"vm": key, "polls": 0}
        self.vms[key] = "deallocating"
        url = f"{self.base_url}/subscriptions/{sub}/providers/Microsoft.Compute/locations/eastus/operations/{op}"
        version = "api-version=2026-04-01"
        return 202, {"Azure-AsyncOperation": f"{url}?p=x&{version}", "Location": f"{url}?p=x&monitor=true&{version}",
                     "Retry-After": "0"}, None  # fmt: skip

    def _poll(self, op: str, monitor: bool) -> tuple[int, dict[str, str], Any]:
        state = self.operations.get(op)
        if state is None:
            return _arm_error(404, f"The operation {op} was not found.")
        if not monitor:
            state["polls"] += 1
        done = state["polls"] > self.polls_in_progress
        if done and self.operation_error is None:
            self.vms[state["vm"]] = "deallocated"
        if monitor:
            return (200, {}, None) if done else (202, {"Retry-After": "0"}, None)
        body: dict[str, Any] = {"name": op, "startTime": "2026-12-01T10:00:00+00:00"}
        if not done:
            return 200, {"Retry-After": "0"}, {**body, "status": "InProgress"}
        if self.operation_error is not None:
            return 200, {}, {**body, "status": "Failed", "error": self.operation_error}
        return 200, {}, {**body, "status": "Succeeded", "endTime": "2026-12-01T10:01:30+00:00"}


def _arm_error(code: int, message: str) -> tuple[int, dict[str, str], Any]:
    return code, {}, {"error": {"code": _ARM_CODES.get(code, "Error"), "message": message}}


# --- serving -------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    api: _Api
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        path, _, query = self.path.partition("?")
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.api.hang is not None:
            self.api.hang.wait(10)
        code, headers, body = self.api.handle(self.command, path, query, self.headers, raw)
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        for name, value in headers.items():
            self.send_header(name, value)
        if body is not None:
            self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 - http.server's names

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
        pass


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, written to ``folder`` (the certificate is its own CA)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return cert_path, key_path


class Server:
    """``api`` served on 127.0.0.1 (a free port) in a thread until ``close``; over TLS with ``tls``'s (cert, key)."""

    def __init__(self, api: _Api, tls: tuple[Path, Path] | None = None) -> None:
        handler = type("Handler", (_Handler,), {"api": api})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="cloud-api", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)
