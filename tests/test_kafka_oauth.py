"""SASL OAUTHBEARER with an OAuth 2.0 server's tokens (``BURNWATCH_KAFKA_SASL_MECHANISM=OAUTHBEARER``: Confluent
Cloud's identity pools, Strimzi or Redpanda with Keycloak or another OIDC provider): each client takes a token from
the token endpoint by the client credentials grant, the SASL username the client id and the password its secret,
and sends it with the extensions set. Every client burnwatch makes connects through a relay in front of the
embedded broker that terminates TLS and takes only the tokens a local token endpoint issued
(:class:`tests.kafka_secure.OAuthServer`)."""

from __future__ import annotations

import asyncio
import base64
import http.server
import json
import threading
import time
from pathlib import Path

import pytest

from detector.settings import load_settings
from detector.simulate import SimConfig
from streams.embedded import EmbeddedBroker, free_port
from streams.kafka import (
    client_options,
    file_records,
    why_refused,
)
from streams.kafka_tokens import OAuthTokens, TokenUnavailable
from streams.process import worker_env
from tests.conftest import ROOT
from tests.helpers import fleet_file
from tests.kafka_secure import OAuthServer, Pki, SecureRelay, make_pki
from tests.test_kafka_security import admin_and_producer_through, refusal, worker_through

CLIENT, SECRET = "burnwatch-worker", "oauth-client-s3cret"
SCOPE = "kafka"
EXTENSIONS = {"logicalCluster": "lkc-abc12", "identityPoolId": "pool-AbCd"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def oauth_env(url: str, ca: Path | None = None, **more: str) -> dict[str, str]:
    env = {"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "BURNWATCH_KAFKA_SASL_MECHANISM": "oauthbearer",
           "BURNWATCH_KAFKA_SASL_USERNAME": CLIENT, "BURNWATCH_KAFKA_SASL_PASSWORD": SECRET,
           "BURNWATCH_KAFKA_OAUTH_TOKEN_URL": url, "BURNWATCH_KAFKA_OAUTH_SCOPE": SCOPE,
           "BURNWATCH_KAFKA_OAUTH_EXTENSIONS": ",".join(f"{k}={v}" for k, v in EXTENSIONS.items())}  # fmt: skip
    if ca is not None:
        env["BURNWATCH_KAFKA_SSL_CA_FILE"] = str(ca)
    return {**env, **more}


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_OAUTH_TOKEN_URL=""),
         "BURNWATCH_KAFKA_OAUTH_TOKEN_URL: Value error, needed with BURNWATCH_KAFKA_SASL_MECHANISM=OAUTHBEARER"),
        (oauth_env("http://login.example/token"),
         "BURNWATCH_KAFKA_OAUTH_TOKEN_URL: Value error, expected an https:// URL (http:// to this machine alone)"),
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_SASL_USERNAME=""),
         "BURNWATCH_KAFKA_SASL_USERNAME: Value error, needed"),
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_SASL_PASSWORD=""),
         "BURNWATCH_KAFKA_SASL_PASSWORD, or this file holding it, is needed"),
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_OAUTH_EXTENSIONS="auth=x"),
         "BURNWATCH_KAFKA_OAUTH_EXTENSIONS: Value error, 'auth=x' is not key=value with a key of letters"),
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_OAUTH_EXTENSIONS="logical-cluster=lkc"),
         "is not key=value with a key of letters"),
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_OAUTH_EXTENSIONS="logicalCluster=lkc-é"),
         "logicalCluster: its value is empty, or not printable ASCII"),  # RFC 7628: VCHAR
        ({"BURNWATCH_KAFKA_OAUTH_TOKEN_URL": "https://login.example/token"},
         "BURNWATCH_KAFKA_OAUTH_TOKEN_URL: Value error, set, but BURNWATCH_KAFKA_SASL_MECHANISM is not OAUTHBEARER"),
    ],
)  # fmt: skip
def test_oauth_settings_that_cannot_work_are_refused_naming_the_setting(environ, said):
    assert said in refusal(environ)
    assert SECRET not in refusal(environ)


def test_the_clients_connect_with_the_oauth_servers_tokens_and_extensions(pki: Pki, tmp_path: Path):
    """Topics created, messages published and read back through the relay, each connection authenticated by a token
    the OAuth server issued to the client, with the extensions set; connections opened together share a token."""
    broker_port = free_port()
    with OAuthServer({CLIENT: SECRET}, scope=SCOPE) as oauth, \
            SecureRelay(broker_port, tls=pki.server_context(), mechanisms=[], tokens=oauth.verify) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        security = load_settings(environ=oauth_env(oauth.url, pki.ca_file)).kafka_security
        assert security.describe() == f"SASL_SSL OAUTHBEARER as client {CLIENT} of {oauth.url}"
        admin_and_producer_through(relay, security)
    assert relay.refused == []
    assert relay.relayed == len(relay.authenticated) > 0
    assert {(m, user) for _, m, user in relay.authenticated} == {("OAUTHBEARER", CLIENT)}
    assert relay.extensions and all(e == EXTENSIONS for e in relay.extensions)
    assert {status for _, status in oauth.asked} == {200} and len(oauth.asked) < len(relay.authenticated)


def test_a_refused_client_or_an_absent_server_is_said_in_one_line(pki: Pki, tmp_path: Path):
    """A wrong client secret: the OAuth server's own reason, and the settings to check, never the secret; a token
    endpoint that does not answer: the URL to check; a token the brokers do not take: the OAuth settings."""
    broker_port = free_port()
    with OAuthServer({CLIENT: SECRET}, scope=SCOPE) as oauth, OAuthServer({CLIENT: SECRET}) as other, \
            SecureRelay(broker_port, tls=pki.server_context(), mechanisms=[], tokens=oauth.verify) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        def why(url: str, **more: str) -> str | None:
            security = load_settings(environ=oauth_env(url, pki.ca_file, **more)).kafka_security
            return asyncio.run(why_refused(relay.bootstrap, security))

        said = why(oauth.url, BURNWATCH_KAFKA_SASL_PASSWORD="wrong-secret")
        assert said is not None and f"the OAuth server at {oauth.url} refused a token (401 invalid_client" in said
        assert "BURNWATCH_KAFKA_SASL_PASSWORD" in said and "wrong-secret" not in said and SECRET not in said
        gone = f"http://127.0.0.1:{free_port()}/token"
        said = why(gone)
        assert said is not None and said.startswith(f"the OAuth server at {gone} did not answer a token request")
        said = why(other.url)  # a token of another server: the brokers refuse it
        assert said is not None and said.startswith(f"OAUTHBEARER authentication as client '{CLIENT}' failed")
        assert why(oauth.url) is None


@pytest.mark.integration
def test_a_worker_reads_and_writes_with_oauth_tokens(pki: Pki, tmp_path: Path, ruleset):
    """The worker on a cluster asking OAUTHBEARER, the client secret a mounted file: it creates its topics, reads a
    small fleet (Faust's consumer) and dead-letters a malformed message (Faust's producer), every connection with a
    token the server issued and the extensions; the secret and the tokens are in no log line, at debug level either."""
    secret = tmp_path / "oauth-secret"
    secret.write_text(SECRET + "\n")
    fleet, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig(hours=1, training_hosts=1, notebooks=1,
                                                              inference_endpoints=1), ruleset.pricing)  # fmt: skip
    records = [*file_records(fleet), ("gpu-metrics", "gpu-host-000", b"{not json")]
    broker_port = free_port()
    with OAuthServer({CLIENT: SECRET}, scope=SCOPE) as oauth, \
            SecureRelay(broker_port, tls=pki.server_context(), mechanisms=[], tokens=oauth.verify) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        settings = oauth_env(oauth.url, pki.ca_file, BURNWATCH_KAFKA_SASL_PASSWORD="",
                             BURNWATCH_KAFKA_SASL_PASSWORD_FILE=str(secret), BURNWATCH_LOG_LEVEL="debug")  # fmt: skip
        env = worker_env(relay.bootstrap, tmp_path / "data", ROOT / "rules", 2, **settings)
        log = worker_through(relay, env, records, tmp_path / "worker.log")
    assert {(m, user) for _, m, user in relay.authenticated} == {("OAUTHBEARER", CLIENT)}
    assert SECRET not in log and oauth.issued and not any(token in log for token in oauth.issued)
    assert "auth=Bearer [redacted]" in log  # aiokafka logs each SASL exchange at debug level


def test_one_token_is_shared_by_clients_on_two_event_loops():
    """Faust runs its consumer on an event loop of its own, in its own thread, and its producer on the worker's: the
    one token provider of the credentials serves both. Asked on the two loops at once, the second waits for the first's
    token and takes it. Before, the two waited on an asyncio lock of one loop: the second loop was never woken when
    the first released it (a wait as long as that loop had nothing else to do), and once the lock was bound to one
    loop, a wait on the other raised RuntimeError in that client's connection."""
    with OAuthServer({CLIENT: SECRET}, life_s=3, delay_s=0.5) as oauth:
        tokens = OAuthTokens(oauth.url, CLIENT, SECRET)
        for again in (False, True):  # the second time, a token due for renewal, and two other loops
            time.sleep(2.1 if again else 0)
            got: dict[int, object] = {}

            def on_its_own_loop(n: int, got: dict[int, object] = got) -> None:
                start = time.monotonic()
                try:
                    got[n] = (asyncio.run(asyncio.wait_for(tokens.token(), 10)), time.monotonic() - start)
                except Exception as exc:  # noqa: BLE001 - the test's answer
                    got[n] = exc

            threads = [threading.Thread(target=on_its_own_loop, args=(n,)) for n in range(2)]
            threads[0].start()
            time.sleep(0.2)  # the first asks the server
            threads[1].start()
            for thread in threads:
                thread.join(15)
            assert all(isinstance(g, tuple) for g in got.values()) and len(got) == 2, got
            (first, _), (second, waited) = got[0], got[1]
            assert first == second and first in oauth.issued
            assert waited < 2, waited
    assert len(oauth.asked) == 2  # one request each time


def test_an_oauth_server_gone_neither_takes_back_a_good_token_nor_reads_as_a_refusal(pki: Pki, tmp_path: Path):
    """The OAuth server down (a restart, an outage) when a token is due for renewal: the connections opened meanwhile
    take the token in hand while it is good, and a running worker's check of its credentials does not count the
    server's silence as the brokers refusing them (three in a row stop the worker: every worker of the group at once,
    to start again against the same absent server). Before, the renewal's failure was raised to each connection with
    the token still good for a third of its life, and the check stopped the worker 45 s into the outage."""
    broker_port = free_port()
    with OAuthServer({CLIENT: SECRET}, scope=SCOPE, life_s=3) as oauth, \
            SecureRelay(broker_port, tls=pki.server_context(), mechanisms=[], tokens=oauth.verify) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        security = load_settings(environ=oauth_env(oauth.url, pki.ca_file)).kafka_security
        options = client_options(security)  # a running worker's, one token provider
        assert asyncio.run(why_refused(relay.bootstrap, security, options, running=True)) is None
        time.sleep(2.2)  # due for renewal, good for 0.8 s more
        oauth.__exit__()
        assert asyncio.run(why_refused(relay.bootstrap, security, options, running=True)) is None
        assert len(relay.authenticated) == 2
        time.sleep(1)  # expired: no connection can be made, nor is one refused
        assert asyncio.run(why_refused(relay.bootstrap, security, options, running=True)) is None
        said = asyncio.run(why_refused(relay.bootstrap, security))  # burnwatch starting, or checking: said
        assert said is not None and said.startswith(f"the OAuth server at {oauth.url} did not answer"), said


def test_a_token_endpoint_that_redirects_is_not_followed_with_the_client_secret():
    """A token URL answered by a redirect (a path mistyped, a front redirecting elsewhere, to http:// even): the client
    secret is not sent on to where it points, and the line names it. Before, urllib followed a 301/302/303 (as a GET)
    with the Authorization header as it was, to any host, in the clear to an http:// one."""
    seen: list[str] = []  # the Authorization header of each request, where it points

    class Handler(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            if self.path == "/elsewhere":
                seen.append(self.headers.get("Authorization", ""))
                self.send_response(404)
            else:
                self.send_response(302)
                self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = answer  # noqa: N815 - http.server's names

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/token"
        with pytest.raises(TokenUnavailable) as caught:
            asyncio.run(OAuthTokens(url, CLIENT, SECRET).token())
    finally:
        server.shutdown()
        server.server_close()
    assert seen == []
    said = str(caught.value)
    assert said.startswith(f"the OAuth server at {url} answered a redirect (302) to http://localhost:"), said
    assert "BURNWATCH_KAFKA_OAUTH_TOKEN_URL" in said and SECRET not in said


def test_a_token_endpoint_behind_a_private_ca_is_trusted_by_its_own_bundle(pki: Pki, tmp_path: Path):
    """A Keycloak behind the company's CA, which the brokers' certificates need not share: its bundle set by
    BURNWATCH_KAFKA_OAUTH_CA_FILE, the clients take tokens from it and connect. Without it the line says the
    certificate is not trusted and which setting trusts it (before, only SSL_CERT_FILE could, for every https call of
    the process, and the line read as a server that did not answer, retried as if it might)."""
    broker_port = free_port()
    with OAuthServer({CLIENT: SECRET}, scope=SCOPE, tls=pki.server_context()) as oauth, \
            SecureRelay(broker_port, tls=pki.server_context(), mechanisms=[], tokens=oauth.verify) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        assert oauth.url.startswith("https://")
        untrusting = load_settings(environ=oauth_env(oauth.url, pki.ca_file)).kafka_security
        said = asyncio.run(why_refused(relay.bootstrap, untrusting))
        assert said is not None and said.startswith(f"the OAuth server at {oauth.url} has a certificate this machine "
                                                     "does not trust"), said  # fmt: skip
        assert said.endswith("set BURNWATCH_KAFKA_OAUTH_CA_FILE to its CAs' PEM bundle")
        with pytest.raises(TokenUnavailable) as caught:
            asyncio.run(OAuthTokens(oauth.url, CLIENT, SECRET).token())
        assert not caught.value.transient  # another try meets the same certificate
        trusting = load_settings(environ=oauth_env(oauth.url, pki.ca_file,
                                                   BURNWATCH_KAFKA_OAUTH_CA_FILE=str(pki.ca_file))).kafka_security  # fmt: skip
        assert asyncio.run(why_refused(relay.bootstrap, trusting)) is None
    assert {(m, user) for _, m, user in relay.authenticated} == {("OAUTHBEARER", CLIENT)}


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_OAUTH_CA_FILE="/nonexistent/ca.pem"),
         "BURNWATCH_KAFKA_OAUTH_CA_FILE: Value error, /nonexistent/ca.pem: no such file"),
        (oauth_env("https://login.example/token", BURNWATCH_KAFKA_OAUTH_CA_FILE=__file__),
         f"BURNWATCH_KAFKA_OAUTH_CA_FILE: Value error, {__file__} is not a PEM bundle of CA certificates"),
        ({"BURNWATCH_KAFKA_OAUTH_CA_FILE": __file__},
         "BURNWATCH_KAFKA_OAUTH_CA_FILE: Value error, set, but BURNWATCH_KAFKA_SASL_MECHANISM is not OAUTHBEARER"),
    ],
)  # fmt: skip
def test_a_token_endpoint_ca_bundle_that_cannot_work_is_refused_at_start(environ, said):
    assert said in refusal(environ)


def test_a_jwt_without_expires_in_is_renewed_by_its_exp():
    """A server that answers no ``expires_in`` (RFC 6749 only recommends it): a JWT's ``exp`` says when the token
    dies, and it is renewed with a third of that life left. Before, every such token was taken as good for an hour,
    and a 3-second (or 5-minute) token was handed to connections long after the brokers refused it."""
    with OAuthServer({CLIENT: SECRET}, life_s=3, jwt=True) as oauth:
        tokens = OAuthTokens(oauth.url, CLIENT, SECRET)
        first = asyncio.run(tokens.token())
        assert first.count(".") == 2 and asyncio.run(tokens.token()) == first
        time.sleep(2.2)  # exp is a whole second: 2 to 3 s of life, a third of it left by now
        assert asyncio.run(tokens.token()) != first
    assert len(oauth.asked) == 2


@pytest.mark.parametrize("payload", [b'{"exp": 1}', b'{"sub": "x"}', b"not json", b'{"exp": 1e999}',
                                     b'{"exp": true}', b"[" * 5000 + b"]" * 5000])  # fmt: skip
def test_a_token_that_is_no_jwt_with_a_future_exp_is_said_or_taken_for_an_hour(payload: bytes):
    """An ``exp`` already past is a clock to check, said in one line; a token with no readable ``exp`` (no JWT, none
    said, absurd) is kept an hour, the commonest life, and never raises anything but a clear line."""
    token = "eyJhbGciOiJub25lIn0." + base64.urlsafe_b64encode(payload).decode().rstrip("=") + ".sig"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"access_token": token, "token_type": "Bearer"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        tokens = OAuthTokens(f"http://127.0.0.1:{server.server_address[1]}/token", CLIENT, SECRET)
        if payload == b'{"exp": 1}':
            with pytest.raises(TokenUnavailable, match=r"answered a token that expired \d+ s ago \(its exp\): is this "
                                                       "machine's clock or the server's wrong"):  # fmt: skip
                asyncio.run(tokens.token())
        else:
            assert asyncio.run(tokens.token()) == token
            assert 3590 < tokens._expires_at - time.time() <= 3600
    finally:
        server.shutdown()
        server.server_close()
