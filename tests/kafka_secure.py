"""A managed cluster's front door for the embedded broker, which speaks PLAINTEXT only: a relay that
terminates TLS (optionally asking for a client certificate) and answers SASL itself (PLAIN, and
SCRAM-SHA-256/512 per RFC 5802 and 7677) before relaying a connection's other requests to the broker.
The broker advertises the relay (:class:`streams.embedded.EmbeddedBroker` ``advertised_port``), so every
connection a client opens goes through it, and must authenticate. The certificates are made here
(:func:`make_pki`), with the ``cryptography`` package.

The broker's ApiVersions answer is passed on as it is: it lists SaslHandshake (v0-1) and
SaslAuthenticate (v0-2), which aiokafka needs to see before it sends them (checked 2026-12).

Helpers only, no tests."""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac
import http.server
import ipaddress
import json
import os
import ssl
import struct
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from streams.embedded import free_port
from tests.kafka_proxy import _client_id_end

__all__ = ["MECHANISMS", "OAuthServer", "Pki", "SecureRelay", "make_pki", "msk_iam_verifier"]

SASL_HANDSHAKE = 17
API_VERSIONS = 18
SASL_AUTHENTICATE = 36
UNSUPPORTED_SASL_MECHANISM = 33
SASL_AUTHENTICATION_FAILED = 58
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SCRAM_HASH = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


# -- certificates ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate for ``127.0.0.1`` and ``localhost`` and a client certificate it signed, as PEM files."""

    ca_file: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def server_context(self, client_certificates: bool = False) -> ssl.SSLContext:
        """The relay's TLS: its certificate, and with ``client_certificates`` a client's signed by this CA required."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if client_certificates:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca_file)
        return context


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> Path:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))  # fmt: skip
    return path


def _certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate | None,
                 issuer_key: ec.EllipticCurvePrivateKey, *, names: Iterable[str] = (),
                 usage: x509.ObjectIdentifier | None = None) -> x509.Certificate:  # fmt: skip
    now = datetime.datetime.now(datetime.timezone.utc)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer.subject if issuer else name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()),
                              critical=False))  # fmt: skip
    if issuer is None:
        builder = builder.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                      content_commitment=False, key_encipherment=False,
                                                      data_encipherment=False, key_agreement=False,
                                                      encipher_only=False, decipher_only=False), critical=True)  # fmt: skip
    alt: list[x509.GeneralName] = []
    for host in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path, server_names: Iterable[str] = ("127.0.0.1", "localhost")) -> Pki:
    """A fresh CA under ``directory`` (made if missing), and the server and client certificates it signs."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("burnwatch test CA", ca_key, None, ca_key)
    (directory / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files = {}
    for role, names, usage in (("server", server_names, ExtendedKeyUsageOID.SERVER_AUTH),
                               ("client", (), ExtendedKeyUsageOID.CLIENT_AUTH)):  # fmt: skip
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(f"burnwatch test {role}", key, ca, ca_key, names=names, usage=usage)
        (directory / f"{role}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        files[role] = (directory / f"{role}.pem", _write_key(directory / f"{role}-key.pem", key))
    return Pki(directory / "ca.pem", *files["server"], *files["client"])


# -- SASL -----------------------------------------------------------------------------------------


class _Refused(Exception):
    """A SASL exchange the relay refuses, with Kafka's message."""


class _Plain:
    """RFC 4616: one message, ``authzid NUL authcid NUL password``."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users
        self.user: str | None = None

    def step(self, token: bytes) -> tuple[bytes, bool]:
        parts = token.split(b"\0")
        if len(parts) != 3 or self.users.get(parts[1].decode()) != parts[2].decode():
            raise _Refused("Authentication failed: Invalid username or password")
        self.user = parts[1].decode()
        return b"", True


class _Scram:
    """RFC 5802 (SCRAM-SHA-256 per RFC 7677, SCRAM-SHA-512 alike), the server's side: two messages."""

    ITERATIONS = 4096  # Kafka's least

    def __init__(self, mechanism: str, users: Mapping[str, str]) -> None:
        self.mechanism, self.hash, self.users = mechanism, _SCRAM_HASH[mechanism], users
        self.user: str | None = None
        self._first: tuple[str, str, bytes, str] | None = None  # client-first-bare, server-first, salt, nonce

    def _refused(self) -> _Refused:
        return _Refused(f"Authentication failed during authentication due to invalid credentials with SASL "
                        f"mechanism {self.mechanism}")  # fmt: skip

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.digest(key, message, self.hash)

    def step(self, token: bytes) -> tuple[bytes, bool]:
        text = token.decode()
        if self._first is None:  # client-first: "n,,n=user,r=nonce"
            if not text.startswith("n,,"):
                raise self._refused()
            bare = text[3:]
            attrs = dict(part.split("=", 1) for part in bare.split(","))
            self.user = attrs["n"].replace("=2C", ",").replace("=3D", "=")
            if self.user not in self.users:
                raise self._refused()
            salt, nonce = os.urandom(16), attrs["r"] + base64.b64encode(os.urandom(18)).decode()
            server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={self.ITERATIONS}"
            self._first = (bare, server_first, salt, nonce)
            return server_first.encode(), False
        bare, server_first, salt, nonce = self._first  # client-final: "c=biws,r=nonce,p=proof"
        without_proof, _, proof = text.rpartition(",p=")
        if dict(part.split("=", 1) for part in without_proof.split(",")).get("r") != nonce:
            raise self._refused()
        auth_message = f"{bare},{server_first},{without_proof}".encode()
        salted = hashlib.pbkdf2_hmac(self.hash, self.users[self.user or ""].encode(), salt, self.ITERATIONS)
        stored_key = hashlib.new(self.hash, self._hmac(salted, b"Client Key")).digest()
        signature = self._hmac(stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(base64.b64decode(proof), signature, strict=False))
        if hashlib.new(self.hash, client_key).digest() != stored_key:
            raise self._refused()
        server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return b"v=" + base64.b64encode(server_signature), True


class _OAuthBearer:
    """RFC 7628, the server's side: one message, ``n,,\\x01auth=Bearer TOKEN\\x01\\x01`` (a GS2 header, then
    key=value pairs each ended by ^A), the token checked by ``verify``, which names its principal or raises
    :class:`_Refused`. The client's first message is its last when the token is taken (Kafka's brokers alike)."""

    def __init__(self, verify: Callable[[str], str]) -> None:
        self.verify = verify
        self.user: str | None = None
        self.extensions: dict[str, str] = {}
        """The SASL extensions sent beside the token (every key=value pair but ``auth``)."""

    def step(self, token: bytes) -> tuple[bytes, bool]:
        header, _, rest = token.decode().partition("\x01")
        pairs = dict(pair.split("=", 1) for pair in rest.split("\x01") if pair)
        scheme, _, bearer = pairs.pop("auth", "").partition(" ")
        if not header.startswith(("n,", "y,")) or scheme.lower() != "bearer" or not bearer:
            raise _Refused("Authentication failed: no bearer token")
        self.user, self.extensions = self.verify(bearer), pairs
        return b"", True


class OAuthServer:
    """An OAuth 2.0 server's token endpoint on 127.0.0.1 (``server.url``), the client credentials grant alone
    (RFC 6749 4.4): the client's id and secret as HTTP Basic credentials, the scope checked where ``scope`` is given.
    Each token it issues (random, good for ``life_s``) is what :meth:`verify` takes, naming the client; each request
    is answered after ``delay_s``; requests and what each was answered are in :attr:`asked`. With ``jwt`` each token
    is a JWT whose ``exp`` says its life, and the answer has no ``expires_in`` (RFC 6749 only recommends it); with
    ``tls`` the endpoint is ``https://`` (its certificate the context's)."""

    def __init__(self, clients: Mapping[str, str], scope: str | None = None, life_s: float = 3600.0,
                 delay_s: float = 0.0, jwt: bool = False, tls: ssl.SSLContext | None = None) -> None:  # fmt: skip
        self.clients, self.scope, self.life_s, self.delay_s, self.jwt = clients, scope, life_s, delay_s, jwt
        self.issued: dict[str, str] = {}
        self.asked: list[tuple[str, int]] = []
        """(client id, or '' if none was given, HTTP status) of each token request."""
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                form = dict(urllib.parse.parse_qsl(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()))
                scheme, _, credentials = self.headers.get("Authorization", "").partition(" ")
                client, _, secret = (base64.b64decode(credentials).decode().partition(":") if scheme == "Basic"
                                     else ("", "", ""))  # fmt: skip
                client, secret = urllib.parse.unquote(client), urllib.parse.unquote(secret)
                time.sleep(server.delay_s)  # a server far away, or busy
                if form.get("grant_type") != "client_credentials":
                    status, body = 400, {"error": "unsupported_grant_type"}
                elif server.clients.get(client) != secret or not client:
                    status, body = 401, {"error": "invalid_client", "error_description": "Invalid client credentials"}
                elif server.scope is not None and form.get("scope") != server.scope:
                    status, body = 400, {"error": "invalid_scope"}
                else:
                    token = base64.urlsafe_b64encode(os.urandom(24)).decode()
                    answer: dict[str, object] = {"token_type": "Bearer", "expires_in": server.life_s}
                    if server.jwt:
                        claims = {"sub": client, "exp": int(time.time() + server.life_s), "jti": token}
                        token = ".".join(base64.urlsafe_b64encode(json.dumps(part).encode()).decode().rstrip("=")
                                         for part in ({"alg": "RS256", "typ": "JWT"}, claims)) + ".c2lnbmF0dXJl"
                        del answer["expires_in"]
                    server.issued[token] = client
                    status, body = 200, {"access_token": token, **answer}
                server.asked.append((client, status))
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self._http.socket = tls.wrap_socket(self._http.socket, server_side=True)
        self.url = f"http{'s' if tls else ''}://127.0.0.1:{self._http.server_address[1]}/oauth2/token"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def verify(self, token: str) -> str:
        """The client a token was issued to, as a broker's OAUTHBEARER check would find it; refused if none."""
        if token not in self.issued:
            raise _Refused("Authentication failed: the token is not one the OAuth server issued")
        return self.issued[token]

    def __enter__(self) -> OAuthServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()


def msk_iam_verifier(keys: Mapping[str, str], region: str) -> Callable[[str], str]:
    """What an MSK broker checks of an IAM token, written from AWS's Signature Version 4 documentation rather than
    with botocore (which signs the client's): the base64url of a URL presigned for ``kafka-cluster:Connect`` at
    ``kafka.REGION.amazonaws.com``, within its ``X-Amz-Expires`` of its date, signed with the secret of an access
    key in ``keys`` (access key id → secret). The principal is the access key id."""

    def refused(why: str) -> _Refused:
        return _Refused(f"Authentication failed: {why}")

    def verify(token: str) -> str:
        try:
            url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        except (ValueError, UnicodeDecodeError):
            raise refused("the token is not base64url") from None
        parts = urllib.parse.urlsplit(url)
        if (parts.scheme, parts.netloc, parts.path or "/") != ("https", f"kafka.{region}.amazonaws.com", "/"):
            raise refused(f"signed for {parts.netloc}, not this cluster's region {region}")
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        params = dict(query)
        if params.get("Action") != "kafka-cluster:Connect" or params.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
            raise refused("not a kafka-cluster:Connect presigned with AWS4-HMAC-SHA256")
        key_id, day, scope_region, service, terminal = params.get("X-Amz-Credential", "////").split("/")
        if (scope_region, service, terminal) != (region, "kafka-cluster", "aws4_request") or key_id not in keys:
            raise refused(f"credential scope {params.get('X-Amz-Credential')!r} is not a known key's in {region}")
        signed_at = datetime.datetime.strptime(params["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        age = time.time() - signed_at.timestamp()
        if not -300 <= age <= int(params["X-Amz-Expires"]):
            raise refused(f"the token is {age:.0f} s old, past its {params['X-Amz-Expires']} s")
        canonical_query = "&".join(f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
                                   for k, v in sorted(query) if k not in ("X-Amz-Signature", "User-Agent"))  # fmt: skip
        canonical = "\n".join(["GET", "/", canonical_query, f"host:{parts.netloc}\n", params["X-Amz-SignedHeaders"],
                               hashlib.sha256(b"").hexdigest()])  # fmt: skip
        to_sign = "\n".join(["AWS4-HMAC-SHA256", params["X-Amz-Date"], f"{day}/{region}/kafka-cluster/aws4_request",
                             hashlib.sha256(canonical.encode()).hexdigest()])  # fmt: skip
        key = ("AWS4" + keys[key_id]).encode()
        for part in (day, region, "kafka-cluster", "aws4_request"):
            key = hmac.digest(key, part.encode(), "sha256")
        if not hmac.compare_digest(hmac.new(key, to_sign.encode(), "sha256").hexdigest(), params.get("X-Amz-Signature", "")):
            raise refused("the signature does not match")
        return key_id

    return verify


def _string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _framed(data: bytes) -> bytes:
    """A frame (the size, then the request or response), as Kafka's BYTES are written too."""
    return struct.pack(">i", len(data)) + data


def _answer(writer: asyncio.StreamWriter, correlation: int, body: bytes) -> None:
    """A response of the relay's own (header v0: the correlation id)."""
    writer.write(_framed(struct.pack(">i", correlation) + body))


# -- the relay ------------------------------------------------------------------------------------


class SecureRelay:
    """``with SecureRelay(broker_port, tls=pki.server_context(), users={"burnwatch": "pw"}) as relay:`` serves
    127.0.0.1:``relay.port``: TLS if ``tls`` is given, SASL (``mechanisms`` of ``users``) if ``users`` is.
    Before a connection has authenticated, only ApiVersions (passed to the broker) and the SASL requests
    are answered; anything else closes it, as Kafka does."""

    def __init__(self, broker_port: int, *, tls: ssl.SSLContext | None = None, users: Mapping[str, str] | None = None,
                 mechanisms: Iterable[str] = MECHANISMS, tokens: Callable[[str], str] | None = None) -> None:  # fmt: skip
        self.broker_port = broker_port
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.tls, self.users, self.mechanisms = tls, users, tuple(mechanisms)
        self.tokens = tokens
        self.extensions: list[dict[str, str]] = []
        """The SASL extensions of each OAUTHBEARER connection that authenticated."""
        """OAUTHBEARER's check of a token (:func:`msk_iam_verifier`): given, the relay asks for SASL and offers it."""
        if tokens is not None:
            self.users, self.mechanisms = users or {}, (*self.mechanisms, "OAUTHBEARER")
        self.authenticated: list[tuple[str, str, str]] = []
        """(client id, mechanism, user) of each connection that authenticated."""
        self.refused: list[str] = []
        """Why each connection refused after TLS was: SASL refusals, requests before authentication. (A failed TLS
        handshake never reaches the relay's code: asyncio drops the connection.)"""
        self.relayed = 0
        """Connections relayed to the broker (after TLS and SASL)."""
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        try:
            broker_in, broker_out = await asyncio.open_connection("127.0.0.1", self.broker_port)
        except OSError:
            client_out.close()
            return
        try:
            if self.users is None or await self._authenticate(client_in, client_out, broker_in, broker_out):
                self.relayed += 1
                pipes = [asyncio.ensure_future(self._pipe(client_in, broker_out)),
                         asyncio.ensure_future(self._pipe(broker_in, client_out))]  # fmt: skip
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
                for pipe in pipes:
                    pipe.cancel()
        except (OSError, asyncio.IncompleteReadError, ValueError, KeyError, struct.error) as exc:
            self.refused.append(f"{type(exc).__name__}: {exc}")
        finally:
            for writer in (client_out, broker_out):
                writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except OSError:
            pass

    async def _authenticate(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter,
                            broker_in: asyncio.StreamReader, broker_out: asyncio.StreamWriter) -> bool:  # fmt: skip
        """The connection's SASL exchange (Kafka's SaslHandshake, then SaslAuthenticate v0-1); True once it
        authenticated, False when it was refused."""
        assert self.users is not None
        exchange: _Plain | _Scram | _OAuthBearer | None = None
        mechanism = ""
        while True:
            frame = await _read_frame(client_in)
            api_key, version, correlation = struct.unpack_from(">hhi", frame, 0)
            client_id, at = _client_id_end(frame)

            if api_key == API_VERSIONS:
                broker_out.write(_framed(frame))
                await broker_out.drain()
                client_out.write(_framed(await _read_frame(broker_in)))
            elif api_key == SASL_HANDSHAKE and exchange is None:
                (length,) = struct.unpack_from(">h", frame, at)
                mechanism = frame[at + 2 : at + 2 + length].decode()
                offered = struct.pack(">i", len(self.mechanisms)) + b"".join(map(_string, self.mechanisms))
                if mechanism not in self.mechanisms:
                    _answer(client_out, correlation, struct.pack(">h", UNSUPPORTED_SASL_MECHANISM) + offered)
                    await client_out.drain()
                    self.refused.append(f"{client_id}: SASL mechanism {mechanism} not offered")
                    return False
                exchange = (_Plain(self.users) if mechanism == "PLAIN"
                            else _OAuthBearer(self.tokens) if mechanism == "OAUTHBEARER" and self.tokens is not None
                            else _Scram(mechanism, self.users))  # fmt: skip
                _answer(client_out, correlation, struct.pack(">h", 0) + offered)
            elif api_key == SASL_AUTHENTICATE and exchange is not None and version <= 1:
                (length,) = struct.unpack_from(">i", frame, at)
                lifetime = struct.pack(">q", 0) if version >= 1 else b""
                try:
                    reply, done = exchange.step(frame[at + 4 : at + 4 + length])
                except _Refused as exc:
                    failed = struct.pack(">h", SASL_AUTHENTICATION_FAILED) + _string(str(exc)) + _framed(b"")
                    _answer(client_out, correlation, failed + lifetime)
                    await client_out.drain()
                    self.refused.append(f"{client_id}: {mechanism} as {exchange.user!r}: {exc}")
                    return False
                _answer(client_out, correlation, struct.pack(">h", 0) + _string(None) + _framed(reply) + lifetime)
                if done:
                    await client_out.drain()
                    self.authenticated.append((client_id, mechanism, exchange.user or ""))
                    if isinstance(exchange, _OAuthBearer):
                        self.extensions.append(exchange.extensions)
                    return True
            else:
                self.refused.append(f"{client_id}: request {api_key} v{version} before authentication")
                return False
            await client_out.drain()

    def drop_connections(self) -> None:
        """Close every connection it holds, as a broker does when the credentials it authenticated are revoked
        (a rotation); it goes on listening, and a client reconnecting authenticates again."""
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        start = asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(timeout=10)

    def __enter__(self) -> SecureRelay:
        self._thread.start()
        start = asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls)
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(timeout=10)
        return self

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __exit__(self, *exc: object | TracebackType) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
