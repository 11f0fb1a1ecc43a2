"""A TCP relay between Kafka clients and the embedded broker that can hold back one kind of
request: a broker slow to answer, at a moment the test chooses. The broker advertises the
relay's address (:class:`streams.embedded.EmbeddedBroker` ``advertised_port``), so every
connection a client opens after bootstrapping goes through it too. It also notes what clients
ask that the embedded broker ignores: each Produce request's ``acks``, each created topic's
replication factor.

Helpers only, no tests."""

from __future__ import annotations

import socket
import struct
import threading
from types import TracebackType

from streams.embedded import free_port

__all__ = ["KafkaProxy", "LATEST"]

PRODUCE = 0
LIST_OFFSETS = 2
"""The Kafka API key of ListOffsets (aiokafka's OffsetRequest)."""
CREATE_TOPICS = 19
LATEST = -1
"""ListOffsets' timestamp asking for a partition's end offset (the high watermark)."""


def list_offsets_timestamps(frame: bytes) -> list[int] | None:
    """The timestamps a ListOffsets request (v0 to v3, the versions aiokafka sends) asks for;
    None for any other request."""
    api_key, version = struct.unpack_from(">hh", frame, 0)
    if api_key != LIST_OFFSETS:
        return None
    if version > 3:
        raise ValueError(f"ListOffsets v{version}: the relay reads v0 to v3")
    (client_id_len,) = struct.unpack_from(">h", frame, 8)
    at = 10 + max(client_id_len, 0) + 4 + (1 if version >= 2 else 0)  # header, replica_id, isolation_level
    (topics,) = struct.unpack_from(">i", frame, at)
    at += 4
    stamps = []
    for _ in range(topics):
        (name_len,) = struct.unpack_from(">h", frame, at)
        at += 2 + name_len
        (partitions,) = struct.unpack_from(">i", frame, at)
        at += 4
        for _ in range(partitions):
            (timestamp,) = struct.unpack_from(">q", frame, at + 4)
            stamps.append(timestamp)
            at += 4 + 8 + (4 if version == 0 else 0)  # partition, timestamp, v0's max_offsets
    return stamps


def _client_id_end(frame: bytes) -> tuple[str, int]:
    """A request header's (v1: the versions aiokafka sends for Produce and CreateTopics) client id,
    and where the request's body starts."""
    (length,) = struct.unpack_from(">h", frame, 8)
    return frame[10 : 10 + max(length, 0)].decode(), 10 + max(length, 0)


def _request_of(frame: bytes, api_key: int, name: str, max_version: int) -> tuple[int, str, int] | None:
    """(version, client id, where the body starts) of a request of ``api_key`` the relay reads; None for another."""
    key, version = struct.unpack_from(">hh", frame, 0)
    if key != api_key:
        return None
    if version > max_version:
        raise ValueError(f"{name} v{version}: the relay reads v0 to v{max_version}")
    return version, *_client_id_end(frame)


def produce_acks(frame: bytes) -> tuple[str, int] | None:
    """(client id, acks) of a Produce request (v0 to v8); None for any other request."""
    request = _request_of(frame, PRODUCE, "Produce", 8)
    if request is None:
        return None
    version, client_id, at = request
    if version >= 3:  # transactional_id, a nullable string
        (length,) = struct.unpack_from(">h", frame, at)
        at += 2 + max(length, 0)
    (acks,) = struct.unpack_from(">h", frame, at)
    return client_id, acks


def created_replication_factors(frame: bytes) -> dict[str, int] | None:
    """topic: replication factor asked of a CreateTopics request (v0 to v4); None for any other request."""
    request = _request_of(frame, CREATE_TOPICS, "CreateTopics", 4)
    if request is None:
        return None
    return {frame[at:end].decode(): factor for at, end, factor in _created(frame, request[2])}


def elsewhere(frame: bytes) -> bytes:
    """A CreateTopics request (v0 to v4) for each topic's name in capitals: another topic, so that those asked for
    never appear."""
    out = bytearray(frame)
    for at, end, _ in _created(frame, _request_of(frame, CREATE_TOPICS, "CreateTopics", 4)[2]):  # type: ignore[index]
        out[at:end] = frame[at:end].upper()
    return bytes(out)


def _created(frame: bytes, at: int) -> list[tuple[int, int, int]]:
    """(start, end) of each topic's name in a CreateTopics request's body from ``at``, and its replication factor."""
    (topics,) = struct.unpack_from(">i", frame, at)
    at += 4
    asked = []
    for _ in range(topics):
        (length,) = struct.unpack_from(">h", frame, at)
        name = (at + 2, at + 2 + length)
        at += 2 + length + 4  # the name, num_partitions
        asked.append((*name, struct.unpack_from(">h", frame, at)[0]))
        at += 2
        (assignments,) = struct.unpack_from(">i", frame, at)
        at += 4
        for _ in range(max(assignments, 0)):
            (replicas,) = struct.unpack_from(">i", frame, at + 4)
            at += 8 + 4 * max(replicas, 0)
        (configs,) = struct.unpack_from(">i", frame, at)
        at += 4
        for _ in range(max(configs, 0)):
            for _ in range(2):  # name, value (nullable)
                (length,) = struct.unpack_from(">h", frame, at)
                at += 2 + max(length, 0)
    return asked


REQUEST_TIMED_OUT = 7


def timed_out_topics(frame: bytes, version: int, asked: list[bytes]) -> bytes:
    """A CreateTopics response (v0 to v4) with each topic created (error 0) answered REQUEST_TIMED_OUT instead, as a
    controller that did not finish within the request's timeout answers (the creation goes on), each topic named as
    ``asked`` (the request's names, in order, before :func:`elsewhere`: of the same lengths)."""
    out = bytearray(frame)
    at = 4 + (4 if version >= 2 else 0)  # the correlation id, throttle_time_ms
    (topics,) = struct.unpack_from(">i", frame, at)
    at += 4
    for i in range(topics):
        (length,) = struct.unpack_from(">h", frame, at)
        if i < len(asked) and len(asked[i]) == length:
            out[at + 2 : at + 2 + length] = asked[i]
        at += 2 + length
        if struct.unpack_from(">h", frame, at)[0] == 0:
            struct.pack_into(">h", out, at, REQUEST_TIMED_OUT)
        at += 2
        if version >= 1:  # error_message (nullable)
            (length,) = struct.unpack_from(">h", frame, at)
            at += 2 + max(length, 0)
    return bytes(out)


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return bytes(data)


class KafkaProxy:
    """``with KafkaProxy(broker_port) as proxy:`` relays 127.0.0.1:``proxy.port`` to the broker.
    After :meth:`hold_end_offsets`, a ListOffsets request for end offsets is not passed on (nor
    anything after it on its connection) until :meth:`release` or the end of the block."""

    def __init__(self, broker_port: int, port: int | None = None) -> None:
        self.broker_port = broker_port
        self.port = port or free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.held = threading.Event()
        """Set once a request is being held."""
        self.errors: list[str] = []
        """Requests the relay could not read (passed on as they were)."""
        self.produced: list[tuple[str, int]] = []
        """(client id, acks) of each Produce request passed on."""
        self.replication_asked: dict[str, int] = {}
        """topic: the replication factor each CreateTopics request passed on asked for it."""
        self.creates_time_out = False
        """Answer each CreateTopics REQUEST_TIMED_OUT (:func:`timed_out_topics`), the topics created all the same."""
        self.creates_elsewhere = False
        """With :attr:`creates_time_out`: and pass each CreateTopics on for other topics (:func:`elsewhere`), so that
        those asked for never appear: a creation that timed out and never finished."""
        self._timing_out: dict[tuple[socket.socket, int], tuple[int, list[bytes]]] = {}
        """(client connection, correlation id) → version and topic names of the CreateTopics requests whose answers
        are rewritten. Per connection: each numbers its requests from 0, so another connection's answer of the same
        id (an ApiVersions) was taken for the CreateTopics', mangled, and the relay's thread died on it."""
        self._holding = False
        self._released = threading.Event()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", self.port))

    def hold_end_offsets(self) -> None:
        self._released.clear()
        self._holding = True

    def release(self) -> None:
        self._holding = False
        self._released.set()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                broker = socket.create_connection(("127.0.0.1", self.broker_port))
            except OSError:
                client.close()
                continue
            self._track(client)
            self._track(broker)
            threading.Thread(target=self._requests, args=(client, broker), daemon=True).start()
            threading.Thread(target=self._responses, args=(broker, client), daemon=True).start()

    def _requests(self, client: socket.socket, broker: socket.socket) -> None:
        """Client to broker, a request at a time (a size, then that many bytes)."""
        try:
            while True:
                size = _read_exactly(client, 4)
                frame = _read_exactly(client, struct.unpack(">i", size)[0])
                try:
                    stamps = list_offsets_timestamps(frame)
                    if (acks := produce_acks(frame)) is not None:
                        self.produced.append(acks)
                    self.replication_asked.update(created_replication_factors(frame) or {})
                except (ValueError, struct.error) as exc:  # passed on unread, and said
                    self.errors.append(str(exc))
                    stamps = None
                if self._holding and stamps is not None and LATEST in stamps:
                    self.held.set()
                    self._released.wait()
                api_key, version, correlation = struct.unpack_from(">hhi", frame, 0)
                if api_key == CREATE_TOPICS and self.creates_time_out:
                    names = [frame[at:end] for at, end, _ in _created(frame, _client_id_end(frame)[1])]
                    self._timing_out[(client, correlation)] = version, names
                    if self.creates_elsewhere:
                        frame = elsewhere(frame)
                broker.sendall(size + frame)
        except OSError:
            self._close_pair(client, broker)

    def _responses(self, broker: socket.socket, client: socket.socket) -> None:
        """Broker to client, a response at a time; the CreateTopics answers :attr:`creates_time_out` rewrites."""
        try:
            while True:
                size = _read_exactly(broker, 4)
                frame = _read_exactly(broker, struct.unpack(">i", size)[0])
                asked = self._timing_out.pop((client, struct.unpack_from(">i", frame, 0)[0]), None)
                if asked is not None:
                    frame = timed_out_topics(frame, *asked)
                client.sendall(struct.pack(">i", len(frame)) + frame)
        except OSError:
            pass
        self._close_pair(client, broker)

    @staticmethod
    def _close_pair(*socks: socket.socket) -> None:
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def __enter__(self) -> KafkaProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object | TracebackType) -> None:
        self._closed = True
        self.release()
        self._listener.close()
        with self._lock:
            self._close_pair(*self._sockets)
