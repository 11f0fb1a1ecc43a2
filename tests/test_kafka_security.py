"""Kafka clusters that ask for TLS and SASL (Amazon MSK, Confluent Cloud, Aiven, a self-run one with
SCRAM): the settings that say how to connect, refused at start when they cannot work, and every client
burnwatch makes (the admin client, the producers, the Faust worker's consumer and producer) connecting
through a relay in front of the embedded broker that terminates TLS and answers SASL itself
(:mod:`tests.kafka_secure`), certificates made in the test."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from detector.kafka_security import PLAINTEXT, KafkaSecurity
from detector.settings import load_settings
from detector.simulate import SimConfig
from streams.embedded import EmbeddedBroker, free_port
from streams.kafka import (
    DEAD_LETTER_TOPIC,
    client_options,
    count_events,
    ensure_topics,
    faust_credentials,
    file_records,  # fmt: skip
    publish_records,
)
from streams.process import WorkerProcess, worker_env
from streams.topology import make_app
from tests.conftest import ROOT
from tests.helpers import burnwatch_in_process, fleet_file
from tests.kafka_secure import Pki, SecureRelay, make_pki

PASSWORD = "s3cret-Kafka-pw"
WRONG = "wrong-Kafka-pw"
USER = "burnwatch"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    """A CA, the relay's certificate for 127.0.0.1 and a client certificate, all signed by it."""
    return make_pki(tmp_path_factory.mktemp("pki"))


def sasl_env(protocol: str = "SASL_SSL", mechanism: str = "SCRAM-SHA-512", ca: Path | None = None,
             **more: str) -> dict[str, str]:  # fmt: skip
    env = {"BURNWATCH_KAFKA_SECURITY_PROTOCOL": protocol, "BURNWATCH_KAFKA_SASL_MECHANISM": mechanism,
           "BURNWATCH_KAFKA_SASL_USERNAME": USER, "BURNWATCH_KAFKA_SASL_PASSWORD": PASSWORD}  # fmt: skip
    if ca is not None:
        env["BURNWATCH_KAFKA_SSL_CA_FILE"] = str(ca)
    return {**env, **more}


def refusal(environ: dict[str, str]) -> str:
    with pytest.raises(ValueError) as caught:
        load_settings(environ=environ)
    assert PASSWORD not in str(caught.value)
    return str(caught.value)


# -- the settings -----------------------------------------------------------------------------------


def test_plaintext_is_the_default_and_adds_nothing_to_any_client():
    """Unset, every client connects as before: no Faust credentials, aiokafka's own default protocol."""
    settings = load_settings(environ={"BURNWATCH_KAFKA_BOOTSTRAP": "127.0.0.1:9092"})
    assert settings.kafka_security == PLAINTEXT
    assert faust_credentials(settings.kafka_security) is None
    assert client_options(settings.kafka_security) == {"security_protocol": "PLAINTEXT"}  # aiokafka's default
    assert make_app(settings).conf.broker_credentials is None


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        # SASL without what it needs: each missing setting named, all at once
        ({"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"},
         ["BURNWATCH_KAFKA_SASL_MECHANISM: Value error, needed with BURNWATCH_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
          "BURNWATCH_KAFKA_SASL_USERNAME: Value error, needed", "BURNWATCH_KAFKA_SASL_PASSWORD, or this file"]),
        # mechanisms that need more than a user and a password
        (sasl_env(mechanism="GSSAPI"), ["BURNWATCH_KAFKA_SASL_MECHANISM: Value error, GSSAPI is not supported"]),
        (sasl_env(mechanism="OAUTHBEARER"), ["BURNWATCH_KAFKA_OAUTH_TOKEN_URL: Value error, needed with "
                                             "BURNWATCH_KAFKA_SASL_MECHANISM=OAUTHBEARER"]),
        # a protocol Kafka does not have
        ({"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "TLS"}, ["BURNWATCH_KAFKA_SECURITY_PROTOCOL: Input should be"]),
        # a password beside PLAINTEXT meant SASL: refused, not ignored
        ({"BURNWATCH_KAFKA_SASL_PASSWORD": PASSWORD}, ["BURNWATCH_KAFKA_SASL_PASSWORD: Value error, set, but "
                                                       "BURNWATCH_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"]),
        # the password given twice
        (sasl_env(BURNWATCH_KAFKA_SASL_PASSWORD_FILE="/etc/hostname"), ["BURNWATCH_KAFKA_SASL_PASSWORD_FILE: Value "
                                                                         "error, set beside"]),
        (sasl_env(protocol="SASL_PLAINTEXT", BURNWATCH_KAFKA_SASL_PASSWORD="",
                  BURNWATCH_KAFKA_SASL_PASSWORD_FILE="/no/such/file"),
         ["BURNWATCH_KAFKA_SASL_PASSWORD_FILE: Value error, cannot read the file it names (No such file or directory)"]),
        # TLS files: missing, or beside a protocol without TLS
        ({"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SSL", "BURNWATCH_KAFKA_SSL_CA_FILE": "/no/such/ca.pem"},
         ["BURNWATCH_KAFKA_SSL_CA_FILE: Value error, /no/such/ca.pem: no such file"]),
        (sasl_env(protocol="SASL_PLAINTEXT", BURNWATCH_KAFKA_SSL_CA_FILE="/etc/hostname"),
         ["BURNWATCH_KAFKA_SSL_CA_FILE: Value error, set, but BURNWATCH_KAFKA_SECURITY_PROTOCOL is SASL_PLAINTEXT"]),
        # hostname checking turned off beside a protocol without TLS: meant SSL or SASL_SSL (review)
        ({"BURNWATCH_KAFKA_SSL_CHECK_HOSTNAME": "false"},
         ["BURNWATCH_KAFKA_SSL_CHECK_HOSTNAME: Value error, set to false, but BURNWATCH_KAFKA_SECURITY_PROTOCOL is "
          "PLAINTEXT"]),
    ],
)  # fmt: skip
def test_settings_a_cluster_cannot_use_are_refused_naming_the_setting(environ, said):
    """Refused when the settings load (the worker's first step), every error at once, each naming its
    variable; never the password."""
    message = refusal(environ)
    for text in said:
        assert text in message, message


def test_tls_files_are_read_when_the_settings_load(pki: Pki, tmp_path: Path):
    """A CA file that is not PEM, a certificate without its key, a key of another certificate: named at start,
    not met at the first connection."""
    not_pem = tmp_path / "ca.der"
    not_pem.write_bytes(b"\x30\x82\x01\x0a not a PEM file")
    tls = {"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SSL"}
    assert "BURNWATCH_KAFKA_SSL_CA_FILE: Value error, " + f"{not_pem} is not a PEM bundle of CA certificates" in \
        refusal({**tls, "BURNWATCH_KAFKA_SSL_CA_FILE": str(not_pem)})  # fmt: skip
    assert "BURNWATCH_KAFKA_SSL_KEY_FILE: Value error, needed with BURNWATCH_KAFKA_SSL_CERT_FILE" in \
        refusal({**tls, "BURNWATCH_KAFKA_SSL_CERT_FILE": str(pki.client_cert)})  # fmt: skip
    assert "BURNWATCH_KAFKA_SSL_KEY_FILE: Value error, set without BURNWATCH_KAFKA_SSL_CERT_FILE" in \
        refusal({**tls, "BURNWATCH_KAFKA_SSL_KEY_FILE": str(pki.client_key)})  # fmt: skip
    assert "are not a PEM certificate and its unencrypted key (KEY_VALUES_MISMATCH)" in refusal(
        {**tls, "BURNWATCH_KAFKA_SSL_CERT_FILE": str(pki.client_cert), "BURNWATCH_KAFKA_SSL_KEY_FILE": str(pki.server_key)})
    settings = load_settings(environ={**tls, "BURNWATCH_KAFKA_SSL_CA_FILE": str(pki.ca_file),
                                      "BURNWATCH_KAFKA_SSL_CERT_FILE": str(pki.client_cert),
                                      "BURNWATCH_KAFKA_SSL_KEY_FILE": str(pki.client_key)})  # fmt: skip
    assert settings.kafka_security.ssl_context() is not None


def test_the_password_file_is_read_trimmed_by_each_client_and_never_shown(tmp_path: Path):
    """A mounted Kubernetes Secret: its trailing newline dropped, read again by a client made after it changed
    (a rotation), and in no repr, not the settings', the connection's or Faust's credentials'."""
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    settings = load_settings(environ=sasl_env(BURNWATCH_KAFKA_SASL_PASSWORD="",
                                              BURNWATCH_KAFKA_SASL_PASSWORD_FILE=str(secret)))  # fmt: skip
    security = settings.kafka_security
    assert security.password is not None and security.password.get_secret_value() == PASSWORD
    credentials = faust_credentials(security)
    for shown in (repr(settings), repr(security), repr(credentials), str(settings)):
        assert PASSWORD not in shown
    secret.write_text("rotated-password")
    assert client_options(settings.kafka_security)["sasl_plain_password"] == "rotated-password"
    secret.write_text("\n")
    assert "is empty" in refusal(sasl_env(BURNWATCH_KAFKA_SASL_PASSWORD="", BURNWATCH_KAFKA_SASL_PASSWORD_FILE=str(secret)))


def test_a_worker_of_the_embedded_broker_speaks_plaintext_whatever_the_environment_holds(tmp_path: Path):
    """``burnwatch demo`` (and the tests) start workers of their own embedded broker with this process's
    environment beneath: a cluster's TLS and SASL settings exported there are not theirs."""
    inherited = sasl_env(BURNWATCH_KAFKA_SSL_CA_FILE="/etc/cluster-ca.pem")
    env = worker_env("127.0.0.1:9092", tmp_path, ROOT / "rules", 2)
    assert load_settings(environ={**inherited, **env}).kafka_security == PLAINTEXT
    assert load_settings(environ={**inherited, **env, **sasl_env()}).kafka_security.mechanism == "SCRAM-SHA-512"


def test_the_worker_refuses_bad_kafka_settings_in_one_line(monkeypatch, capsys):
    """``burnwatch worker`` with SASL and no mechanism: exit 1 before anything connects, the setting named."""
    monkeypatch.setattr("streams.cli.configure_logging", lambda *a, **k: None)
    for var, value in sasl_env(mechanism="", BURNWATCH_KAFKA_BOOTSTRAP="127.0.0.1:1").items():
        monkeypatch.setenv(var, value)
    code, _, err = burnwatch_in_process(capsys, "worker")
    assert code == 1 and "BURNWATCH_KAFKA_SASL_MECHANISM: Value error, needed" in err and PASSWORD not in err, err


# -- through TLS and SASL ---------------------------------------------------------------------------


def read_back(bootstrap: str, security: KafkaSecurity, topic: str, n: int, partitions: int = 2) -> list[bytes]:
    """``n`` messages of ``topic``, read by a consumer of its own connecting as ``security`` says."""

    async def go() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **client_options(security))
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
            await consumer.seek_to_beginning()
            values: list[bytes] = []
            async with asyncio.timeout(60):
                while len(values) < n:
                    for records in (await consumer.getmany(timeout_ms=1000)).values():
                        values.extend(r.value for r in records if r.value is not None)
            return values
        finally:
            await consumer.stop()

    return asyncio.run(go())


@pytest.mark.integration
@pytest.mark.parametrize(
    ("protocol", "mechanism", "client_certificate"),
    [
        ("SSL", None, False),  # TLS alone
        ("SSL", None, True),  # TLS, the client known by its certificate (mutual TLS)
        ("SASL_PLAINTEXT", "SCRAM-SHA-256", False),
        ("SASL_SSL", "PLAIN", False),  # Confluent Cloud's
        ("SASL_SSL", "SCRAM-SHA-512", True),  # MSK's SASL/SCRAM, with a client certificate as well
    ],
)  # fmt: skip
def test_the_admin_client_and_the_producer_connect_as_the_settings_say(pki: Pki, tmp_path: Path, protocol, mechanism,
                                                                       client_certificate):  # fmt: skip
    """Topics created and messages published through the relay, and read back through it: every connection
    went through TLS and authenticated as the settings say."""
    env = {"BURNWATCH_KAFKA_SECURITY_PROTOCOL": protocol}
    if mechanism:
        env |= sasl_env(protocol, mechanism)
    if protocol.endswith("SSL"):
        env["BURNWATCH_KAFKA_SSL_CA_FILE"] = str(pki.ca_file)
    if client_certificate:
        env |= {"BURNWATCH_KAFKA_SSL_CERT_FILE": str(pki.client_cert), "BURNWATCH_KAFKA_SSL_KEY_FILE": str(pki.client_key)}
    security = load_settings(environ=env).kafka_security
    tls = pki.server_context(client_certificates=client_certificate) if protocol.endswith("SSL") else None
    broker_port = free_port()
    with SecureRelay(broker_port, tls=tls, users={USER: PASSWORD} if mechanism else None) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        admin_and_producer_through(relay, security)
    assert relay.refused == []
    if mechanism:
        assert relay.relayed == len(relay.authenticated) > 0
        assert {(m, user) for _, m, user in relay.authenticated} == {(mechanism, USER)}


def admin_and_producer_through(relay: SecureRelay, security: KafkaSecurity) -> None:
    """Topics created, five messages published and read back through ``relay`` as ``security`` says."""
    asyncio.run(ensure_topics(relay.bootstrap, 2, security=security))
    sent = [(DEAD_LETTER_TOPIC, f"k{i}", f"message {i}".encode()) for i in range(5)]
    assert asyncio.run(publish_records(relay.bootstrap, sent, security=security)) == 5
    assert sorted(read_back(relay.bootstrap, security, DEAD_LETTER_TOPIC, 5)) == sorted(v for _, _, v in sent)


def worker_through(relay: SecureRelay, env: dict[str, str], records: list[tuple[str, str, bytes]], log_path: Path) -> str:
    """A real worker with ``env`` reading ``records`` (the last one malformed) published through ``relay``: it takes
    every event and dead-letters the last, every connection through the relay, Faust's clients and aiokafka's alike,
    none refused. Its log."""
    worker = WorkerProcess(env, log_path).start()
    try:
        worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
        security = load_settings(environ=env).kafka_security
        asyncio.run(publish_records(relay.bootstrap, records, security=security))
        events = count_events(records[:-1])
        worker.wait_until(lambda h: h["events"] >= events and h["dead_letters"] >= 1, timeout=120)
    finally:
        assert worker.stop() == 0, worker.tail()
    assert relay.refused == [], relay.refused
    clients = {client for client, _, _ in relay.authenticated}
    assert any(c.startswith("faust") for c in clients) and any(c.startswith("aiokafka") for c in clients), clients
    return worker.log_path.read_text()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("mechanism", "password"),
    [
        ("SCRAM-SHA-512", "file"),  # MSK's SASL/SCRAM, the password a mounted Secret
        ("PLAIN", "variable"),  # Confluent Cloud's API key and secret; at debug level aiokafka logs the exchange
    ],
)
def test_a_worker_reads_and_writes_through_sasl_ssl(pki: Pki, tmp_path: Path, ruleset, mechanism, password):
    """The worker on a cluster asking SASL over TLS, the CA given. It creates its topics, reads a small fleet
    (Faust's consumer) and dead-letters a malformed message (Faust's producer), every connection authenticated;
    the password is in no log line, at debug level either."""
    secret = tmp_path / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    given = {"BURNWATCH_KAFKA_SASL_PASSWORD": "", "BURNWATCH_KAFKA_SASL_PASSWORD_FILE": str(secret)} \
        if password == "file" else {"BURNWATCH_LOG_LEVEL": "debug"}  # fmt: skip
    fleet, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig(hours=1, training_hosts=1, notebooks=1,
                                                              inference_endpoints=1), ruleset.pricing)  # fmt: skip
    records = [*file_records(fleet), ("gpu-metrics", "gpu-host-000", b"{not json")]
    broker_port = free_port()
    with SecureRelay(broker_port, tls=pki.server_context(), users={USER: PASSWORD}, mechanisms=[mechanism]) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        env = worker_env(relay.bootstrap, tmp_path / "data", ROOT / "rules", 2,
                         **sasl_env(mechanism=mechanism, ca=pki.ca_file, **given))  # fmt: skip
        log = worker_through(relay, env, records, tmp_path / "worker.log")
    assert {(m, user) for _, m, user in relay.authenticated} == {(mechanism, USER)}
    assert relay.relayed == len(relay.authenticated)
    assert PASSWORD not in log
    if password == "variable":
        assert "SaslAuthenticate" in log  # the exchange was logged, redacted


@pytest.mark.integration
def test_a_wrong_password_stops_the_worker_at_once_saying_why(pki: Pki, tmp_path: Path):
    """SASL/PLAIN refused: the worker exits 1 within seconds with the broker's reason and the settings to check,
    no traceback, and the password in no line (aiokafka logs a PLAIN exchange whole at debug level)."""
    broker_port = free_port()
    with SecureRelay(broker_port, tls=pki.server_context(), users={USER: PASSWORD}) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        env = worker_env(relay.bootstrap, tmp_path / "data", ROOT / "rules", 2, BURNWATCH_LOG_LEVEL="debug",
                         **sasl_env(mechanism="PLAIN", ca=pki.ca_file, BURNWATCH_KAFKA_SASL_PASSWORD=WRONG))  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            code = worker.wait_exit(timeout=90)
        finally:
            worker.stop()
    log = worker.log_path.read_text()
    assert code == 1, log
    assert f"Kafka at {relay.bootstrap} refused the connection: SASL PLAIN authentication as 'burnwatch' failed " \
           "([Error 58] SaslAuthenticationFailed: Authentication failed: Invalid username or password): check " \
           "BURNWATCH_KAFKA_SASL_USERNAME, BURNWATCH_KAFKA_SASL_PASSWORD" in log, log  # fmt: skip
    assert "Traceback" not in log and WRONG not in log and PASSWORD not in log
    assert relay.refused and relay.relayed == 0


@pytest.mark.integration
def test_a_server_certificate_not_trusted_is_refused(pki: Pki, tmp_path: Path, ruleset, monkeypatch, capsys):
    """``burnwatch replay`` to brokers whose certificate another CA signed, or that names another host: exit 1
    naming the setting to check, nothing sent; with the host check off (the chain still verified), it goes."""
    monkeypatch.setattr("streams.cli.configure_logging", lambda *a, **k: None)
    fleet, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig(hours=0.5, training_hosts=1, notebooks=0),
                          ruleset.pricing)  # fmt: skip
    stranger = make_pki(tmp_path / "stranger")  # another CA, its own certificate for 127.0.0.1
    elsewhere = make_pki(tmp_path / "elsewhere", server_names=["kafka.example.com"])
    cases = [(stranger, {}, "the broker's TLS certificate is not trusted (unable to get local issuer certificate): "
                            "check BURNWATCH_KAFKA_SSL_CA_FILE"),
             (elsewhere, {}, "the broker's TLS certificate is not trusted (IP address mismatch, certificate is not "
                             "valid for '127.0.0.1'.): check BURNWATCH_KAFKA_SSL_CHECK_HOSTNAME"),
             (elsewhere, {"BURNWATCH_KAFKA_SSL_CHECK_HOSTNAME": "false"}, None)]  # fmt: skip
    for server, more, said in cases:
        broker_port = free_port()
        with SecureRelay(broker_port, tls=server.server_context()) as relay, \
                EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
            env = {"BURNWATCH_KAFKA_BOOTSTRAP": relay.bootstrap, "BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SSL",
                   "BURNWATCH_KAFKA_SSL_CA_FILE": str(pki.ca_file if server is stranger else elsewhere.ca_file),
                   "BURNWATCH_PARTITIONS": "2", **more}  # fmt: skip
            for var, value in env.items():
                monkeypatch.setenv(var, value)
            code, _, err = burnwatch_in_process(capsys, "replay", str(fleet))
        if said is None:
            assert code == 0 and "published" in err and relay.relayed > 0, err
        else:
            assert code == 1 and f"Kafka at {relay.bootstrap} refused the connection: {said}" in err, err
            assert relay.relayed == 0


@pytest.mark.integration
def test_the_default_protocol_to_a_tls_port_says_to_check_the_protocol(pki: Pki, tmp_path: Path, ruleset, monkeypatch,
                                                                        capsys):  # fmt: skip
    """The usual first-day slip: the cluster's TLS (or SASL) port with the protocol left PLAINTEXT. aiokafka only
    says it could not bootstrap; the port does accept connections, so the error says to check the protocol and
    the port, each protocol's port named (review: it read as a broker down, exit 69 with nothing to act on)."""
    monkeypatch.setattr("streams.cli.configure_logging", lambda *a, **k: None)
    fleet, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig(hours=0.25, training_hosts=1, notebooks=0),
                          ruleset.pricing)  # fmt: skip
    broker_port = free_port()
    with SecureRelay(broker_port, tls=pki.server_context()) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        for var, value in {"BURNWATCH_KAFKA_BOOTSTRAP": relay.bootstrap, "BURNWATCH_PARTITIONS": "2"}.items():
            monkeypatch.setenv(var, value)
        code, _, err = burnwatch_in_process(capsys, "replay", str(fleet))
    assert code == 69 and f"cannot reach Kafka at {relay.bootstrap}" in err, err
    assert "the port accepts connections, but not as PLAINTEXT: if Kafka is up, check BURNWATCH_KAFKA_SECURITY_PROTOCOL" \
        in err, err  # fmt: skip
    assert "Traceback" not in err and relay.relayed == 0


# -- review: what the password must never show as ---------------------------------------------------


@pytest.mark.parametrize("password", ["back\\slash-pw", "quotes-'\"-pw", "pässwörd-ü", "it's-a-pw"])
def test_a_plain_password_is_redacted_in_aiokafka_debug_log_of_its_token(password):
    """aiokafka logs the SaslAuthenticate request at debug level, its token a bytes repr: a password with a
    backslash, a quote or a non-ASCII letter reads escaped there, and was shown whole."""
    import logging

    from aiokafka.conn import SaslPlainAuthenticator
    from aiokafka.protocol.admin import SaslAuthenticateRequest_v1

    from detector.logs import RedactingFilter, register_settings

    register_settings(load_settings(environ=sasl_env(mechanism="PLAIN", BURNWATCH_KAFKA_SASL_PASSWORD=password)))
    token, _ = next(SaslPlainAuthenticator(loop=None, sasl_plain_password=password,
                                           sasl_plain_username=USER)._authenticator)  # fmt: skip
    record = logging.LogRecord("aiokafka.conn", logging.DEBUG, __file__, 0, "Request to %s:%d %d: %s",
                               ("127.0.0.1", 9096, 2, SaslAuthenticateRequest_v1(token)), None)  # fmt: skip
    shown = str(SaslAuthenticateRequest_v1(token))
    assert password not in shown or "'" in password  # the bytes repr escapes it (or quotes around it)
    RedactingFilter().filter(record)
    logged = record.getMessage()
    assert "[redacted]" in logged and repr(password.encode())[2:-1] not in logged and password not in logged, logged


def test_a_password_put_in_the_file_variable_is_not_echoed():
    """BURNWATCH_KAFKA_SASL_PASSWORD_FILE holding the password itself (a Secret's key mapped to the wrong
    variable): the error said "<password>: cannot read it ... (got '<password>')"."""
    secret = "Sup3r+Secret/ApiSecretValue"
    for env in (sasl_env(mechanism="PLAIN", BURNWATCH_KAFKA_SASL_PASSWORD="", BURNWATCH_KAFKA_SASL_PASSWORD_FILE=secret),
                {"BURNWATCH_KAFKA_SASL_PASSWORD_FILE": secret}):  # fmt: skip
        message = refusal(env)
        assert "BURNWATCH_KAFKA_SASL_PASSWORD_FILE: Value error" in message and secret not in message, message


@pytest.mark.integration
@pytest.mark.parametrize("secret_updated", [True, False], ids=["secret-updated", "brokers-only"])
def test_a_worker_whose_password_is_rotated_stops_saying_why(pki: Pki, tmp_path: Path, secret_updated: bool):
    """The cluster's password rotated while the worker runs (MSK's Secret, a Confluent API key replaced) and its
    connections dropped. The worker made its clients with the old password and reconnected with it for ever
    (~60 refused attempts a second here), /healthz "ok", nothing consumed (review of the TLS/SASL settings).
    Now it stops (exit 70) for its orchestrator to start it again with the new one, saying why: when its
    mounted password file holds another password at two checks in a row, and once the brokers refuse its
    credentials at three checks in a row when they alone changed (the Secret not updated yet, or the password
    given in the environment)."""
    secret = tmp_path / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    users = {USER: PASSWORD}
    broker_port = free_port()
    with SecureRelay(broker_port, tls=pki.server_context(), users=users, mechanisms=["SCRAM-SHA-512"]) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        env = worker_env(relay.bootstrap, tmp_path / "data", ROOT / "rules", 2,
                         **sasl_env(ca=pki.ca_file, BURNWATCH_KAFKA_SASL_PASSWORD="",
                                    BURNWATCH_KAFKA_SASL_PASSWORD_FILE=str(secret)))  # fmt: skip
        worker = WorkerProcess(env, tmp_path / "worker.log").start()
        try:
            worker.wait_until(lambda h: h["partitions"] > 0, timeout=120)
            users[USER] = "rotated-Kafka-pw"
            if secret_updated:
                secret.write_text("rotated-Kafka-pw\n")
            relay.drop_connections()
            assert worker.wait_exit(120) == 70
            line = worker.wait_for_log("worker_failed", timeout=5)
            if secret_updated:
                assert "kafka_password_changed" in line and "BURNWATCH_KAFKA_SASL_PASSWORD_FILE" in line, line
            else:
                assert "kafka_refused" in line and "authentication as" in line and "failed" in line, line
            assert "rotated-Kafka-pw" not in worker.tail() and PASSWORD not in worker.tail()
        finally:
            worker.stop()
