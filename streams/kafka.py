"""Kafka plumbing outside Faust: topic creation and the fast replay publisher (aiokafka).

Every topic burnwatch uses is created here, with ``BURNWATCH_REPLICATION_FACTOR`` replicas
(the broker's ``default.replication.factor`` unless set), and every producer burnwatch runs
waits for all in-sync replicas (``acks=all``): a message acknowledged is on every replica the
topic keeps, which ``min.insync.replicas`` bounds (docs/architecture.md, "Kafka topics").

Every client, these and Faust's, connects as ``BURNWATCH_KAFKA_SECURITY_PROTOCOL`` and the settings
beside it say (:class:`detector.kafka_security.KafkaSecurity`): :func:`faust_credentials` is the one
place that turns them into a client's options, for Faust and, through Faust's own mapping, aiokafka."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import faust
import msgspec
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.conn import collect_hosts, create_conn
from aiokafka.errors import KafkaError, SaslAuthenticationFailed, UnsupportedSaslMechanismError
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from faust.types.auth import CredentialsT

from detector.events import TOPICS
from detector.kafka_security import PLAINTEXT, KafkaSecurity
from detector.replay import read_replay
from detector.settings import BROKER_DEFAULT, Settings
from streams.kafka_tokens import OAuthTokens, TokenUnavailable

__all__ = ["ACKS", "CREATED_WITHIN_S", "DEAD_LETTER_TOPIC", "KafkaRefused", "TopicsMismatched", "TopicsNotCreated",
           "TopicsRefused", "accepts_connections",
           "client_options", "count_events", "create_missing", "ensure_topics", "ensure_worker_topics", "faust_credentials",
           "faust_leader_topic", "file_records", "producer", "publish_file", "publish_records", "why_refused"]  # fmt: skip

DEAD_LETTER_TOPIC = "dead-letter"
ACKS = "all"
"""What every producer burnwatch runs waits for: the write on all in-sync replicas, as many as the
topic's ``min.insync.replicas`` at least. ``acks=1`` (the leader alone) loses what a failed leader
had not copied yet; on one replica both are the same."""
_TOPIC_EXISTS = 36
"""Kafka's TOPIC_ALREADY_EXISTS: another worker or bridge created it first."""
_TIMED_OUT = 7
"""Kafka's REQUEST_TIMED_OUT for a topic of a CreateTopics: the controller did not finish within the request's
timeout, and goes on creating it."""
CREATED_WITHIN_S = 60.0
"""How long topics whose creation timed out may take to be listed before the command gives up (exit 69)."""

log = structlog.get_logger("burnwatch.kafka")


class TopicsRefused(RuntimeError):
    """The broker refused to create a topic (a replication factor above its broker count or
    below a managed cluster's minimum, a creation policy, no permission)."""


class TopicsNotCreated(ConnectionError):
    """The controller timed out creating topics (Kafka's REQUEST_TIMED_OUT: the creation goes on) and the brokers did
    not list them within :data:`CREATED_WITHIN_S`: a cluster busy or degraded, worth trying again (exit 69)."""


class TopicsMismatched(RuntimeError):
    """The input topics exist with different partition counts: a resource's usage, GPU metrics and runs
    would be read by different workers, each deciding on part of what it sent."""


_NAME_MISMATCH = (62, 63, 64)
"""OpenSSL's X509_V_ERR_HOSTNAME_MISMATCH, _EMAIL_MISMATCH, _IP_ADDRESS_MISMATCH: a trusted certificate of another name."""


class KafkaRefused(RuntimeError):
    """The brokers refused burnwatch's connection, or burnwatch theirs: SASL credentials refused, a
    certificate not trusted. Trying again does not help; the message names the settings to check."""


def faust_credentials(security: KafkaSecurity) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for ``security``; None for PLAINTEXT (Faust's default). Faust 0.15
    hands them to its consumer, its producer and the client it would create topics with."""
    context = security.ssl_context()
    if security.iam:
        from streams.msk_iam_tokens import MskIamTokens  # (botocore at the first use, not at every command's start)

        return faust.OAuthCredentials(oauth_cb=MskIamTokens(security.aws_region), ssl_context=context)
    if security.oauth:
        secret = security.password.get_secret_value() if security.password is not None else ""
        tokens = OAuthTokens(security.oauth_token_url or "", security.username or "", secret, security.oauth_scope,
                             dict(security.oauth_extensions), security.oauth_ca_file)  # fmt: skip
        return faust.OAuthCredentials(oauth_cb=tokens, ssl_context=context)
    if security.sasl:
        password = security.password.get_secret_value() if security.password is not None else None
        return faust.SASLCredentials(username=security.username, password=password, ssl_context=context,
                                     mechanism=security.mechanism)  # fmt: skip
    return faust.SSLCredentials(context) if context is not None else None


def client_options(security: KafkaSecurity) -> dict[str, Any]:
    """The connection options of an aiokafka client for ``security``, by Faust's own mapping of
    :func:`faust_credentials`: burnwatch's clients and Faust's connect alike (PLAINTEXT: aiokafka's defaults)."""
    return dict(credentials_to_aiokafka_auth(faust_credentials(security)))


async def why_refused(bootstrap: str, security: KafkaSecurity, options: Mapping[str, Any] | None = None, *,
                      running: bool = False) -> str | None:  # fmt: skip
    """Why the brokers at ``bootstrap`` refuse a connection made as ``security`` says (or with the client
    ``options`` given: a running worker's, made when it started), naming the settings to check; None when
    none refused one (a broker that does not answer). aiokafka's clients say only that they could not
    bootstrap, and log the reason. ``running`` (a worker checking the credentials it runs with): only a
    definite refusal counts (credentials, a certificate), not a handshake cut short (a broker going down
    in a rolling restart) nor an OAuth server that does not answer, and one broker that takes the credentials
    answers."""
    options = client_options(security) if options is None else options
    for host, port, _ in collect_hosts(bootstrap, randomize=running):  # (running: not always the first broker)
        try:
            conn = await create_conn(host, port, request_timeout_ms=10_000, **options)
        except TokenUnavailable as exc:
            if running and exc.transient:  # the OAuth server silent: not the brokers refusing the credentials
                return None
            return str(exc)
        except SaslAuthenticationFailed as exc:
            if security.iam:
                return (f"{security.mechanism} authentication in {security.aws_region} failed ({exc}): check the AWS "
                        "credentials the process runs with (IRSA's role, the instance profile, AWS_* variables), that "
                        "their IAM policy allows kafka-cluster:Connect on the cluster, and "
                        "BURNWATCH_KAFKA_AWS_REGION")  # fmt: skip
            if security.oauth:
                return (f"OAUTHBEARER authentication as client {security.username!r} failed ({exc}): the brokers do "
                        f"not take the tokens of {security.oauth_token_url}: check BURNWATCH_KAFKA_OAUTH_TOKEN_URL, "
                        "BURNWATCH_KAFKA_OAUTH_SCOPE and BURNWATCH_KAFKA_OAUTH_EXTENSIONS")  # fmt: skip
            return (f"SASL {security.mechanism} authentication as {security.username!r} failed ({exc}): check "
                    "BURNWATCH_KAFKA_SASL_USERNAME, BURNWATCH_KAFKA_SASL_PASSWORD (or _FILE) and "
                    "BURNWATCH_KAFKA_SASL_MECHANISM")  # fmt: skip
        except UnsupportedSaslMechanismError as exc:
            return f"{exc}: check BURNWATCH_KAFKA_SASL_MECHANISM"
        except ssl.SSLCertVerificationError as exc:
            setting = "BURNWATCH_KAFKA_SSL_CHECK_HOSTNAME" if exc.verify_code in _NAME_MISMATCH else \
                "BURNWATCH_KAFKA_SSL_CA_FILE (unset: the system's trust store)"  # fmt: skip
            return f"the broker's TLS certificate is not trusted ({exc.verify_message}): check {setting}"
        except ssl.SSLError as exc:
            if running:
                continue
            return (f"the TLS handshake failed ({exc.reason or exc}): check BURNWATCH_KAFKA_SECURITY_PROTOCOL and, "
                    "where the brokers ask for a client certificate, BURNWATCH_KAFKA_SSL_CERT_FILE")  # fmt: skip
        except (OSError, KafkaError, asyncio.TimeoutError):
            continue
        conn.close()
        if running:
            break  # the credentials are taken
    return None


async def accepts_connections(bootstrap: str, timeout_s: float = 3.0) -> bool:
    """Whether any of the brokers at ``bootstrap`` accepts a TCP connection: one that does, yet no Kafka client
    could bootstrap from, most likely speaks another protocol on that port (TLS, SASL) than the one set."""
    for host, port, _ in collect_hosts(bootstrap, randomize=False):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        except (OSError, asyncio.TimeoutError):
            continue
        writer.close()
        return True
    return False


def faust_leader_topic(app_id: str) -> str:
    """The one topic Faust creates for itself (its leader assignor's); the worker creates it first."""
    return f"{app_id}-__assignor-__leader"


def _new_topic(name: str, partitions: int, replication_factor: int) -> NewTopic:
    """aiokafka's ``NewTopic`` takes -1 only beside a replica assignment; an empty one sends -1 with
    none, which a broker since Kafka 2.4 (KIP-464) reads as its ``default.replication.factor``."""
    if replication_factor == BROKER_DEFAULT:
        return NewTopic(name, num_partitions=partitions, replication_factor=BROKER_DEFAULT, replica_assignments={})
    return NewTopic(name, num_partitions=partitions, replication_factor=replication_factor)


async def create_missing(bootstrap: str, topics: Mapping[str, int], replication_factor: int = BROKER_DEFAULT,
                         security: KafkaSecurity = PLAINTEXT) -> None:  # fmt: skip
    """Create the topics (name: partitions) the broker does not have; a refusal raises
    :class:`TopicsRefused` (aiokafka returns it as an error code, which was taken for success). The
    input topics that exist already must have one partition count (:class:`TopicsMismatched`); an input
    missing beside them is made with theirs, whatever ``topics`` asks."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, **client_options(security))
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        there = sorted(name for name in TOPICS if name in topics and name in existing)
        if there:
            count = _copartitioned(bootstrap, await admin.describe_topics(there))
            if count is not None:
                topics = {name: count if name in TOPICS else n for name, n in topics.items()}
        missing = [_new_topic(n, p, replication_factor) for n, p in topics.items() if n not in existing]
        if not missing:
            return
        response = await admin.create_topics(missing)
        refused = [f"{topic} ({rest[0] if rest and rest[0] else f'error {code}'})"  # v0 answers with no message
                   for topic, code, *rest in response.topic_errors if code not in (0, _TOPIC_EXISTS, _TIMED_OUT)]  # fmt: skip
        if refused:
            factor = "the broker's default" if replication_factor == BROKER_DEFAULT else replication_factor
            raise TopicsRefused(f"Kafka at {bootstrap} refused to create topics with replication factor {factor} "
                                f"(BURNWATCH_REPLICATION_FACTOR): {'; '.join(refused)}. Set the variable, or create "
                                "the topics up front (docs/architecture.md, 'Kafka topics')")  # fmt: skip
        pending = {topic for topic, code, *_ in response.topic_errors if code == _TIMED_OUT}
        if pending:
            await _until_listed(admin, bootstrap, pending)
    finally:
        await admin.close()


async def _until_listed(admin: AIOKafkaAdminClient, bootstrap: str, topics: set[str]) -> None:
    """Wait for topics whose creation timed out on the controller (REQUEST_TIMED_OUT: Kafka goes on creating them)
    to be listed by the brokers, asking again with backoff; :class:`TopicsNotCreated` past :data:`CREATED_WITHIN_S`.
    Before, the timeout was read as a refusal: the worker exited 1 telling the user to set the replication factor."""
    deadline, wait = time.monotonic() + CREATED_WITHIN_S, 0.1
    while True:
        missing = topics - set(await admin.list_topics())
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise TopicsNotCreated(f"Kafka at {bootstrap} timed out creating {', '.join(sorted(missing))} and did not "
                                   f"list them within {CREATED_WITHIN_S:.0f} s: the cluster is busy or degraded; "
                                   "starting again finds them once created")  # fmt: skip
        log.info("kafka_topics_pending", topics=sorted(missing), note="the controller timed out creating them; waiting")
        await asyncio.sleep(wait)
        wait = min(wait * 2, 2.0)


def _copartitioned(bootstrap: str, described: Iterable[Mapping[str, Any]]) -> int | None:
    """The partition count of the input topics that exist (``described``: the broker's metadata of them;
    None: none it could describe now), or :class:`TopicsMismatched` where they differ. Kafka places a key
    by its hash modulo the count, and the worker's partition assignor gives each partition number of the
    three inputs to one worker only when all three have as many."""
    counts = {t["topic"]: len(t["partitions"]) for t in described if not t.get("error_code") and t.get("partitions")}
    if len(set(counts.values())) > 1:
        said = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
        most = max(counts.values())
        fewer = ", ".join(sorted(name for name, n in counts.items() if n < most))
        raise TopicsMismatched(
            f"Kafka at {bootstrap}: the input topics have different partition counts ({said}); they must have one, "
            "or a resource's usage, GPU metrics and runs go to different workers, each seeing part of them. Add "
            f"partitions to {fewer} to make {most} (kafka-topics.sh --bootstrap-server {bootstrap} --alter --topic "
            f"NAME --partitions {most}); keys that move start their detection afresh (docs/architecture.md, "
            "'Kafka topics')")  # fmt: skip
    return next(iter(counts.values()), None)


async def ensure_topics(bootstrap: str, partitions: int, names: Iterable[str] = (*TOPICS, DEAD_LETTER_TOPIC),
                        replication_factor: int = BROKER_DEFAULT, security: KafkaSecurity = PLAINTEXT) -> None:  # fmt: skip
    """Create the topics if missing, with one partition count for all three inputs.

    The inputs are co-partitioned by key (resource id), so a resource's usage and
    metrics land on the same partition number and so on the same worker.
    """
    await create_missing(bootstrap, dict.fromkeys(names, partitions), replication_factor, security)


async def ensure_worker_topics(settings: Settings) -> None:
    """Every topic a worker uses, Faust's own included, before Faust starts: Faust cannot ask for the
    broker's default replication factor (its setting refuses -1), so it is left none to create."""
    topics = dict.fromkeys((*TOPICS, DEAD_LETTER_TOPIC), settings.partitions)
    topics[faust_leader_topic(settings.app_id)] = 1
    await create_missing(settings.kafka_bootstrap, topics, settings.replication_factor, settings.kafka_security)


def producer(bootstrap: str, security: KafkaSecurity = PLAINTEXT, **options: Any) -> AIOKafkaProducer:
    """An aiokafka producer as burnwatch runs them: ``acks=all``, 8 MiB requests (a bridge's message
    of a large host, a replay's batch)."""
    return AIOKafkaProducer(bootstrap_servers=bootstrap, acks=ACKS, linger_ms=5, max_request_size=8 << 20,
                            **client_options(security), **options)  # fmt: skip


async def publish_records(
    bootstrap: str,
    records: Iterable[tuple[str, str, bytes]],
    *,
    speed: float | None = None,
    on_sent: Callable[[int], None] | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Publish ``(topic, key, value)`` records with aiokafka's batching; return the count.

    With ``speed`` the records are paced by their event time (600: ten event-minutes
    per wall-clock second), as a live fleet would send them; without, as fast as possible.
    """
    sender = producer(bootstrap, security, max_batch_size=1 << 20)
    await sender.start()
    sent = 0
    origin: tuple[float, float] | None = None
    try:
        pending = []
        for topic, key, value in records:
            if speed:
                end = value_end_time(value)
                if end is not None:
                    if origin is None:
                        origin = (end, time.monotonic())
                    delay = origin[1] + (end - origin[0]) / speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
            pending.append(await sender.send(topic, value=value, key=key.encode()))
            sent += 1
            if len(pending) >= 5000 or speed:
                if len(pending) >= 5000:
                    await asyncio.gather(*pending)
                    pending.clear()
                if on_sent:
                    on_sent(sent)
        await asyncio.gather(*pending)
        await sender.flush()
    finally:
        await sender.stop()
    return sent


def value_end_time(value: bytes) -> float | None:
    """Latest ``ts`` in a message value: when an exporter would have sent it."""
    try:
        decoded = msgspec.json.decode(value)
    except msgspec.DecodeError:
        return None
    latest = None
    for item in decoded if isinstance(decoded, list) else [decoded]:
        ts = item.get("ts") if isinstance(item, dict) else None
        if isinstance(ts, str):
            try:
                t = datetime.fromisoformat(ts).timestamp()
            except ValueError:
                continue
            latest = t if latest is None or t > latest else latest
    return latest


def count_events(records: Iterable[tuple[str, str, bytes]]) -> int:
    """Events in ``(topic, key, value)`` records (a value is one event or an array)."""
    return sum(len(v) if isinstance(v, list) else 1 for v in (msgspec.json.decode(r[2]) for r in records))


def file_records(path: str | Path) -> Iterator[tuple[str, str, bytes]]:
    """``(topic, key, value bytes)`` of each line of a replay file."""
    for _, record in read_replay(path):
        yield record.topic, record.key, bytes(record.value)


async def publish_file(bootstrap: str, path: str | Path, partitions: int, speed: float | None = None,
                       replication_factor: int = BROKER_DEFAULT, security: KafkaSecurity = PLAINTEXT) -> int:  # fmt: skip
    await ensure_topics(bootstrap, partitions, replication_factor=replication_factor, security=security)
    return await publish_records(bootstrap, file_records(path), speed=speed, security=security)
