"""Amazon MSK's IAM access control (``BURNWATCH_KAFKA_SASL_MECHANISM=AWS_MSK_IAM``: the only way into MSK
Serverless, and what MSK clusters on EKS use with IRSA): SASL OAUTHBEARER over TLS, the token a URL presigned with
the process's AWS credentials by AWS's own signer. Every client burnwatch makes connects through a relay in front of
the embedded broker that terminates TLS and checks each token as MSK does, by a Signature Version 4 check written
from AWS's documentation (:func:`tests.kafka_secure.msk_iam_verifier`), with credentials given as the AWS SDK's
variables. Nothing reaches AWS: the instance metadata service is turned off and no AWS file is read."""

from __future__ import annotations

import asyncio
import base64
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from detector.settings import load_settings
from detector.simulate import SimConfig
from streams.embedded import EmbeddedBroker, free_port
from streams.kafka import (
    DEAD_LETTER_TOPIC,
    client_options,
    ensure_topics,
    faust_credentials,
    file_records,
    why_refused,
)
from streams.msk_iam_tokens import MskIamTokens
from streams.process import worker_env
from tests.conftest import ROOT
from tests.helpers import burnwatch_in_process, fleet_file
from tests.kafka_secure import Pki, SecureRelay, make_pki, msk_iam_verifier
from tests.test_kafka_security import admin_and_producer_through, refusal, worker_through

KEY_ID, SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
REGION = "eu-west-1"
BOOTSTRAP = f"b-1.fleet.abc123.c2.kafka.{REGION}.amazonaws.com:9098"


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def aws(monkeypatch, tmp_path: Path) -> dict[str, str]:
    """The AWS SDK's variables with an access key, and nothing else of AWS's reachable: no metadata service, no
    shared files (the test's process and the workers it starts alike)."""
    env = {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials")}  # fmt: skip
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ROLE_ARN",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def msk(broker_port: int, pki: Pki) -> SecureRelay:
    """MSK's IAM listener in front of the embedded broker on ``broker_port``: TLS, and OAUTHBEARER alone, its tokens
    checked as MSK checks them, for the test's access key in :data:`REGION`."""
    return SecureRelay(broker_port, tls=pki.server_context(), mechanisms=[], tokens=msk_iam_verifier({KEY_ID: SECRET}, REGION))


def credential_process(monkeypatch, tmp_path: Path, *, down: Path, delay_s: float = 0.0) -> None:
    """The process's AWS credentials from a ``credential_process`` (as IRSA's are from STS): temporary ones, within
    the 10 minutes before their end in which botocore loads them anew at every use, after ``delay_s``; while the
    file ``down`` is there, none (STS unreachable, throttling)."""
    script = tmp_path / "aws-credentials.py"
    script.write_text(f"""import datetime, json, pathlib, sys, time
time.sleep({delay_s})
if pathlib.Path({str(down)!r}).exists():
    sys.exit("STS is unavailable")
expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(minutes=5)
print(json.dumps({{"Version": 1, "AccessKeyId": {KEY_ID!r}, "SecretAccessKey": {SECRET!r}, "SessionToken": "session",
                  "Expiration": expiry.isoformat()}}))
""")
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\ncredential_process = {sys.executable} {script}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")


def iam_env(ca: Path | None = None, **more: str) -> dict[str, str]:
    env = {"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "BURNWATCH_KAFKA_SASL_MECHANISM": "aws_msk_iam"}
    if ca is not None:
        env["BURNWATCH_KAFKA_SSL_CA_FILE"] = str(ca)
    return {**env, **more}


# -- the settings -----------------------------------------------------------------------------------


def test_the_region_is_read_from_msks_broker_names_or_set(aws):
    """MSK's broker names hold the region (provisioned and serverless alike); a name that does not, the setting or
    the AWS SDK's AWS_REGION; no username or password is asked."""
    settings = load_settings(environ=iam_env(BURNWATCH_KAFKA_BOOTSTRAP=BOOTSTRAP))
    assert (settings.kafka_security.aws_region, settings.kafka_security.iam) == (REGION, True)
    assert settings.kafka_security.describe() == f"SASL_SSL AWS_MSK_IAM in {REGION}"
    serverless = "boot-x1y2.c1.kafka-serverless.ap-southeast-2.amazonaws.com:9098"
    assert load_settings(environ=iam_env(BURNWATCH_KAFKA_BOOTSTRAP=serverless)).kafka_security.aws_region \
        == "ap-southeast-2"  # fmt: skip
    given = iam_env(BURNWATCH_KAFKA_BOOTSTRAP="kafka.internal:9098", BURNWATCH_KAFKA_AWS_REGION="us-west-2")
    assert load_settings(environ=given).kafka_security.aws_region == "us-west-2"
    assert load_settings(environ=iam_env(BURNWATCH_KAFKA_BOOTSTRAP="kafka.internal:9098")).kafka_security.aws_region is None


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (iam_env(BURNWATCH_KAFKA_SECURITY_PROTOCOL="SASL_PLAINTEXT"),
         "BURNWATCH_KAFKA_SASL_MECHANISM: Value error, AWS_MSK_IAM goes with BURNWATCH_KAFKA_SECURITY_PROTOCOL=SASL_SSL"),
        (iam_env(BURNWATCH_KAFKA_SASL_USERNAME="burnwatch"),
         "BURNWATCH_KAFKA_SASL_USERNAME: Value error, set, but BURNWATCH_KAFKA_SASL_MECHANISM is AWS_MSK_IAM"),
        (iam_env(BURNWATCH_KAFKA_SASL_PASSWORD="pw"), "BURNWATCH_KAFKA_SASL_PASSWORD: Value error, set, but"),
        (iam_env(BURNWATCH_KAFKA_AWS_REGION="Ireland"), "BURNWATCH_KAFKA_AWS_REGION: String should match pattern"),
        ({"BURNWATCH_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "BURNWATCH_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
          "BURNWATCH_KAFKA_SASL_USERNAME": "u", "BURNWATCH_KAFKA_SASL_PASSWORD": "p", "BURNWATCH_KAFKA_AWS_REGION": REGION},
         "BURNWATCH_KAFKA_AWS_REGION: Value error, set, but BURNWATCH_KAFKA_SASL_MECHANISM is not AWS_MSK_IAM"),
        (iam_env(BURNWATCH_KAFKA_SASL_MECHANISM="GSSAPI"),
         "GSSAPI is not supported: burnwatch speaks PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (a username and a "
         "password), OAUTHBEARER (an OAuth server's tokens) and AWS_MSK_IAM (Amazon MSK's IAM access control)"),
    ],
)  # fmt: skip
def test_settings_msk_iam_cannot_use_are_refused_naming_the_setting(environ, said):
    assert said in refusal(environ)


# -- tokens ------------------------------------------------------------------------------------------


def test_a_token_is_shared_by_connections_till_a_third_of_its_life_is_left_then_made_anew(aws):
    """Each token MSK's own check takes; connections opened together get one; once a third of its life (15 minutes)
    is left, the next connection gets a fresh one."""
    tokens = MskIamTokens(REGION)
    verify = msk_iam_verifier({KEY_ID: SECRET}, REGION)

    async def three() -> list[str]:
        return list(await asyncio.gather(tokens.token(), tokens.token(), tokens.token()))

    first = asyncio.run(three())
    assert len(set(first)) == 1 and verify(first[0]) == KEY_ID
    assert tokens._expires_at - tokens._issued_at == pytest.approx(900, abs=2)
    tokens._issued_at -= 500  # (as if issued 500 s ago: 400 of its 900 s left)
    tokens._expires_at -= 500
    assert asyncio.run(tokens.token()) == first[0]
    tokens._issued_at -= 150  # 250 s left, under a third
    tokens._expires_at -= 150
    renewed = asyncio.run(tokens.token())
    assert verify(renewed) == KEY_ID


def test_one_provider_serves_clients_on_several_event_loops(aws, monkeypatch, tmp_path: Path):
    """Faust's consumer runs on an event loop of its own, in a thread of its own, and shares the worker's token
    provider (its broker_credentials) with the producer and the credentials check on the worker's loop. Tokens asked
    for on two loops at once while the credentials take a moment to load (STS): each loop gets the one token, at the
    first and at a renewal. (Red before: the second loop waited on an asyncio lock the first released from its own
    thread, which never woke it; at the next contention, "bound to a different event loop".)"""
    credential_process(monkeypatch, tmp_path, down=tmp_path / "sts-down", delay_s=1.0)
    security = load_settings(environ=iam_env(BURNWATCH_KAFKA_AWS_REGION=REGION)).kafka_security
    tokens = faust_credentials(security).oauth_cb
    verify = msk_iam_verifier({KEY_ID: SECRET}, REGION)

    def together() -> list[str]:
        got: list[str] = []
        start = threading.Barrier(2)

        def on_a_loop_of_its_own() -> None:
            start.wait()
            got.append(asyncio.run(tokens.token()))

        threads = [threading.Thread(target=on_a_loop_of_its_own, daemon=True) for _ in range(2)]
        began = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=15)
        assert time.monotonic() - began < 10 and len(got) == 2, got
        return got

    first = together()
    assert first[0] == first[1] and verify(first[0]) == KEY_ID
    tokens._issued_at -= 650  # (a third of its life left: the next asks for a new one)
    tokens._expires_at -= 650
    renewed = together()
    assert renewed[0] == renewed[1] != first[0] and verify(renewed[0]) == KEY_ID


def test_credentials_failing_for_a_while_stop_no_client(aws, monkeypatch, pki: Pki, tmp_path: Path):
    """The AWS credentials unavailable when a token is due for renewal (STS unreachable for a while): the token in
    hand, still good, serves the connections made meanwhile; once it has expired too, the clients retry, and go on
    when the credentials are back. (Red before: the error reached aiokafka as no error of a connection, which ended
    the consumer's fetcher for good: it read nothing ever after.)"""
    down = tmp_path / "sts-down"
    credential_process(monkeypatch, tmp_path, down=down)
    security = load_settings(environ=iam_env(pki.ca_file, BURNWATCH_KAFKA_AWS_REGION=REGION)).kafka_security
    broker_port = free_port()
    with msk(broker_port, pki) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        asyncio.run(ensure_topics(relay.bootstrap, 2, security=security))

        async def go() -> None:
            options = client_options(security)
            tokens = options["sasl_oauth_token_provider"]
            producer = AIOKafkaProducer(bootstrap_servers=relay.bootstrap, **options)
            consumer = AIOKafkaConsumer(bootstrap_servers=relay.bootstrap, enable_auto_commit=False, **options)
            await producer.start()
            await consumer.start()
            consumer.assign([TopicPartition(DEAD_LETTER_TOPIC, p) for p in range(2)])
            await consumer.seek_to_beginning()

            async def passes(value: bytes) -> None:
                await asyncio.wait_for(producer.send_and_wait(DEAD_LETTER_TOPIC, value, partition=0), 30)
                async with asyncio.timeout(30):
                    while True:
                        records = [r.value for rs in (await consumer.getmany(timeout_ms=500)).values() for r in rs]
                        if value in records:
                            return

            async def dropped() -> None:  # (the brokers close connections: a restart, a token's end)
                await asyncio.get_running_loop().run_in_executor(None, relay.drop_connections)

            try:
                await passes(b"before")
                down.touch()
                tokens._issued_at, tokens._expires_at = time.time() - 700, time.time() + 200  # due, 200 s left
                await dropped()
                await passes(b"while the token in hand is good")
                tokens._expires_at = time.time() - 1
                await dropped()
                await asyncio.sleep(3)  # every connection fails meanwhile
                down.unlink()
                await passes(b"once the credentials are back")
            finally:
                await consumer.stop()
                await producer.stop()

        asyncio.run(go())
    refused = [why for why in relay.refused if not why.startswith("IncompleteReadError")]  # (closed for want of a token)
    assert refused == [], refused  # no token refused: none sent past its end


def test_no_region_or_no_credentials_is_said_at_the_first_connection(aws, monkeypatch, pki: Pki, tmp_path: Path):
    """A cluster whose brokers' names do not say the region, with no AWS_REGION: the check of the connection says to
    set BURNWATCH_KAFKA_AWS_REGION; with no AWS credentials anywhere, that none were found; a key MSK does not take,
    the settings and the IAM policy to check."""
    broker_port = free_port()
    with msk(broker_port, pki) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        def why(**more: str) -> str | None:
            environ = iam_env(pki.ca_file, BURNWATCH_KAFKA_BOOTSTRAP=relay.bootstrap, **more)
            return asyncio.run(why_refused(relay.bootstrap, load_settings(environ=environ).kafka_security))

        assert "AWS_MSK_IAM needs the cluster's region: set BURNWATCH_KAFKA_AWS_REGION" in why()
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        assert "no AWS credentials found for AWS_MSK_IAM" in why(BURNWATCH_KAFKA_AWS_REGION=REGION)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAOTHERKEY00000000")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        said = why(BURNWATCH_KAFKA_AWS_REGION=REGION)
        assert said is not None and said.startswith(f"AWS_MSK_IAM authentication in {REGION} failed")
        assert "kafka-cluster:Connect" in said and SECRET not in said
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
        assert why(BURNWATCH_KAFKA_AWS_REGION=REGION) is None
    assert relay.authenticated and {m for _, m, _ in relay.authenticated} == {"OAUTHBEARER"}


@pytest.mark.integration
def test_a_command_says_in_one_line_what_iam_lacks(aws, monkeypatch, capsys, pki: Pki, tmp_path: Path, ruleset):
    """``burnwatch replay`` (``worker`` alike: both make their topics first) with no region known, then with no AWS
    credentials: exit 1 and the line saying what to set, no traceback, nothing sent. (Red before: the error was no
    Kafka error to the command, which showed a traceback.)"""
    monkeypatch.setattr("streams.cli.configure_logging", lambda *a, **k: None)
    fleet, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig(hours=0.25, training_hosts=1, notebooks=0),
                          ruleset.pricing)  # fmt: skip
    broker_port = free_port()
    with msk(broker_port, pki) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        for var, value in {**iam_env(pki.ca_file), "BURNWATCH_KAFKA_BOOTSTRAP": relay.bootstrap,
                           "BURNWATCH_PARTITIONS": "2"}.items():  # fmt: skip
            monkeypatch.setenv(var, value)
        code, _, err = burnwatch_in_process(capsys, "replay", str(fleet))
        assert code == 1 and f"Kafka at {relay.bootstrap} refused the connection: AWS_MSK_IAM needs the cluster's " \
            "region: set BURNWATCH_KAFKA_AWS_REGION" in err, err  # fmt: skip
        monkeypatch.setenv("BURNWATCH_KAFKA_AWS_REGION", REGION)
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        code, _, err = burnwatch_in_process(capsys, "replay", str(fleet))
        assert code == 1 and f"Kafka at {relay.bootstrap} refused the connection: no AWS credentials found" in err, err
    assert "Traceback" not in err and relay.relayed == 0


def test_the_admin_client_and_the_producer_connect_with_iam_tokens(aws, pki: Pki, tmp_path: Path):
    """Topics created, messages published and read back through the relay, every connection authenticated by a
    token MSK's check takes, as the key the AWS variables give."""
    security = load_settings(environ=iam_env(pki.ca_file, BURNWATCH_KAFKA_AWS_REGION=REGION)).kafka_security
    broker_port = free_port()
    with msk(broker_port, pki) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        admin_and_producer_through(relay, security)
    assert relay.refused == []
    assert relay.relayed == len(relay.authenticated) > 0
    assert {(m, user) for _, m, user in relay.authenticated} == {("OAUTHBEARER", KEY_ID)}


@pytest.mark.integration
def test_a_worker_reads_and_writes_through_msk_iam(aws, pki: Pki, tmp_path: Path, ruleset):
    """The worker on a cluster asking MSK's IAM, its credentials the AWS SDK's variables (as IRSA's would be found):
    it creates its topics, reads a small fleet (Faust's consumer) and dead-letters a malformed message (Faust's
    producer), every connection authenticated with a token; the secret key is in no log line."""
    fleet, _ = fleet_file(tmp_path / "fleet.jsonl", SimConfig(hours=1, training_hosts=1, notebooks=1,
                                                              inference_endpoints=1), ruleset.pricing)  # fmt: skip
    records = [*file_records(fleet), ("gpu-metrics", "gpu-host-000", b"{not json")]
    broker_port = free_port()
    with msk(broker_port, pki) as relay, \
            EmbeddedBroker(port=broker_port, advertised_port=relay.port, log_path=tmp_path / "broker.log"):  # fmt: skip
        settings = iam_env(pki.ca_file, BURNWATCH_KAFKA_AWS_REGION=REGION, BURNWATCH_LOG_LEVEL="debug")
        env = worker_env(relay.bootstrap, tmp_path / "data", ROOT / "rules", 2, **settings, **aws)
        log = worker_through(relay, env, records, tmp_path / "worker.log")
    assert {(m, user) for _, m, user in relay.authenticated} == {("OAUTHBEARER", KEY_ID)}
    assert SECRET not in log
    # A token is a bearer credential for 15 minutes: at debug level aiokafka logs the OAUTHBEARER exchange, and
    # botocore the request it presigns and then its signature, which together make the token again.
    assert "auth=Bearer [redacted]" in log and "Signature:\\n[redacted]" in log  # (logged, redacted)
    assert base64.urlsafe_b64encode(b"https://kafka.").decode() not in log  # every token begins so
    assert not re.search(r"Signature:(\\n|\s)*[0-9a-f]{64}", log)
