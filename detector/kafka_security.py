"""How burnwatch's Kafka clients reach a cluster: TLS and SASL, as managed clusters (Amazon MSK,
Confluent Cloud, Aiven) and self-run ones with TLS + SASL/SCRAM ask.

One value, :class:`KafkaSecurity`, built once from the settings (``Settings.kafka_security``) and
handed to every client burnwatch makes; :mod:`streams.kafka` turns it into Faust's credentials and
aiokafka's options. PLAINTEXT, the default, adds nothing to any client: behaviour as before.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

__all__ = ["MECHANISMS", "PLAINTEXT", "PROTOCOLS", "SASL_PROTOCOLS", "TLS_PROTOCOLS", "KafkaSecurity", "Mechanism",
           "Protocol", "check_identity", "check_trust"]  # fmt: skip

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PROTOCOLS: tuple[Protocol, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS: tuple[Protocol, ...] = ("SSL", "SASL_SSL")
"""The protocols over TLS: the CA, client certificate and hostname settings go with these alone."""
SASL_PROTOCOLS: tuple[Protocol, ...] = ("SASL_PLAINTEXT", "SASL_SSL")
"""The protocols that authenticate with SASL: the mechanism, user and password go with these alone."""
MECHANISMS: tuple[Mechanism, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms burnwatch speaks: a username and a password. GSSAPI (Kerberos) and OAUTHBEARER
(MSK's IAM, Confluent's OAuth) need more than that and are refused when the settings load."""


def _no_key_password() -> str:
    """An encrypted key would make OpenSSL ask for its password on the terminal, and a worker
    without one wait for ever: refused instead (the key is read as an unencrypted PEM)."""
    raise ValueError("the key is encrypted")


def check_trust(ca_file: Path | None) -> ssl.SSLContext:
    """A client context trusting ``ca_file`` (a PEM bundle), or the system's trust store when None;
    raises ``ssl.SSLError`` or ``OSError`` for a file that is not one."""
    return ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)


def check_identity(context: ssl.SSLContext, cert_file: Path, key_file: Path) -> ssl.SSLContext:
    """``context`` presenting the client certificate ``cert_file`` with its key (mutual TLS); raises
    ``ssl.SSLError`` or ``OSError`` for files that are not a PEM certificate and its unencrypted key."""
    context.load_cert_chain(str(cert_file), str(key_file), password=_no_key_password)
    return context


@dataclass(frozen=True)
class KafkaSecurity:
    """What a Kafka client needs to connect, checked when the settings load (:mod:`detector.settings`).
    The password is a ``SecretStr``: no repr, log line or error shows it."""

    protocol: Protocol = "PLAINTEXT"
    mechanism: Mechanism | None = None
    username: str | None = None
    password: SecretStr | None = None
    ca_file: Path | None = None
    """A PEM bundle of the CAs that sign the brokers' certificates; None: the system's trust store."""
    cert_file: Path | None = None
    key_file: Path | None = None
    """A client certificate and its key (mutual TLS), both or neither."""
    check_hostname: bool = True

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    @property
    def sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context of a connection (None without TLS): certificates always verified, the
        broker's name checked against its certificate unless ``check_hostname`` is off."""
        if not self.tls:
            return None
        context = check_trust(self.ca_file)
        context.check_hostname = self.check_hostname  # the certificate's chain is verified either way
        if self.cert_file is not None and self.key_file is not None:
            check_identity(context, self.cert_file, self.key_file)
        return context

    def describe(self) -> str:
        """For a log line: the protocol, and the mechanism and user where SASL is used (never the password)."""
        return f"{self.protocol} {self.mechanism} as {self.username}" if self.sasl else self.protocol


PLAINTEXT = KafkaSecurity()
"""No TLS, no SASL: the default, and the embedded broker's."""
