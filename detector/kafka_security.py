"""How burnwatch's Kafka clients reach a cluster: TLS and SASL, as managed clusters (Amazon MSK,
Confluent Cloud, Aiven) and self-run ones with TLS + SASL/SCRAM ask, and Amazon MSK's IAM access control
(SASL OAUTHBEARER with a token signed by the AWS credentials: the only way into MSK Serverless).

One value, :class:`KafkaSecurity`, built once from the settings (``Settings.kafka_security``) and
handed to every client burnwatch makes; :mod:`streams.kafka` turns it into Faust's credentials and
aiokafka's options. PLAINTEXT, the default, adds nothing to any client: behaviour as before.
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import SecretStr

__all__ = ["AWS_MSK_IAM", "MECHANISMS", "OAUTHBEARER", "PASSWORD_MECHANISMS", "PLAINTEXT", "PROTOCOLS", "SASL_PROTOCOLS",
           "TLS_PROTOCOLS", "KafkaSecurity", "Mechanism", "Protocol", "check_identity", "check_trust",
           "msk_region"]  # fmt: skip

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "AWS_MSK_IAM", "OAUTHBEARER"]
PROTOCOLS: tuple[Protocol, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
TLS_PROTOCOLS: tuple[Protocol, ...] = ("SSL", "SASL_SSL")
"""The protocols over TLS: the CA, client certificate and hostname settings go with these alone."""
SASL_PROTOCOLS: tuple[Protocol, ...] = ("SASL_PLAINTEXT", "SASL_SSL")
"""The protocols that authenticate with SASL: the mechanism, user and password go with these alone."""
PASSWORD_MECHANISMS: tuple[Mechanism, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
"""The SASL mechanisms that authenticate with a username and a password."""
AWS_MSK_IAM: Mechanism = "AWS_MSK_IAM"
"""Amazon MSK's IAM access control (the name MSK's own clients give it): SASL OAUTHBEARER on the wire, the token
a URL presigned with the AWS credentials the process finds by the AWS SDK's standard chain (IRSA's role on EKS,
the instance profile, ``AWS_*`` variables); no username or password."""
OAUTHBEARER: Mechanism = "OAUTHBEARER"
"""SASL OAUTHBEARER with an OAuth 2.0 server's tokens (Confluent Cloud's identity pools, Strimzi and Redpanda with
Keycloak or another OIDC provider): each client takes a token by the client credentials grant (RFC 6749 4.4) from
the token endpoint, the SASL username the client id and the password its secret."""
MECHANISMS: tuple[Mechanism, ...] = (*PASSWORD_MECHANISMS, AWS_MSK_IAM, OAUTHBEARER)
"""The SASL mechanisms burnwatch speaks. GSSAPI (Kerberos) needs more than settings can give and is refused when
the settings load."""
_MSK_HOST = re.compile(r"\.kafka(?:-serverless)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$", re.IGNORECASE)
"""An MSK broker's name (``b-1.NAME.ID.c2.kafka.us-east-1.amazonaws.com``, ``boot-ID.c1.kafka-serverless.REGION…``),
the region its third label from the end."""


def msk_region(bootstrap: str, environ: Mapping[str, str]) -> str | None:
    """The AWS region of an MSK cluster: where its brokers' names say (MSK's own names always do), else the AWS
    SDK's ``AWS_REGION`` or ``AWS_DEFAULT_REGION``; None when neither does."""
    for address in bootstrap.split(","):
        host = address.strip().rpartition(":")[0] or address.strip()
        found = _MSK_HOST.search(host)
        if found:
            return found.group(1).lower()
    return environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or None


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
    aws_region: str | None = None
    """The MSK cluster's AWS region, which its IAM tokens are signed for (:data:`AWS_MSK_IAM`)."""
    oauth_token_url: str | None = None
    """The OAuth server's token endpoint (:data:`OAUTHBEARER`)."""
    oauth_scope: str | None = None
    oauth_extensions: tuple[tuple[str, str], ...] = ()
    """SASL extensions sent beside the token (RFC 7628): Confluent Cloud's ``logicalCluster`` and ``identityPoolId``."""
    oauth_ca_file: Path | None = None
    """A PEM bundle of the CAs that sign the token endpoint's certificate; None: the system's trust store."""

    @property
    def tls(self) -> bool:
        return self.protocol in TLS_PROTOCOLS

    @property
    def sasl(self) -> bool:
        return self.protocol in SASL_PROTOCOLS

    @property
    def iam(self) -> bool:
        """Amazon MSK's IAM access control (:data:`AWS_MSK_IAM`)."""
        return self.sasl and self.mechanism == AWS_MSK_IAM

    @property
    def oauth(self) -> bool:
        """Tokens of an OAuth server (:data:`OAUTHBEARER`)."""
        return self.sasl and self.mechanism == OAUTHBEARER

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
        if self.iam:
            return f"{self.protocol} {self.mechanism} in {self.aws_region}"
        if self.oauth:
            return f"{self.protocol} {self.mechanism} as client {self.username} of {self.oauth_token_url}"
        return f"{self.protocol} {self.mechanism} as {self.username}" if self.sasl else self.protocol


PLAINTEXT = KafkaSecurity()
"""No TLS, no SASL: the default, and the embedded broker's."""
