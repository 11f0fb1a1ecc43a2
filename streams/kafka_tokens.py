"""The SASL OAUTHBEARER tokens of Amazon MSK's IAM access control (:data:`detector.kafka_security.AWS_MSK_IAM`).

A token is a URL presigned for ``kafka-cluster:Connect`` in the cluster's region with the AWS credentials the
process finds by the AWS SDK's standard chain (``AWS_*`` variables, IRSA's web identity on EKS, the shared files,
the instance profile), made by AWS's own signer (``aws-msk-iam-sasl-signer-python``). It is good for 15 minutes;
a broker closes a connection whose token has expired, and the client connects again with a fresh one, so each is
made anew once a third of its life is left, and shared by the connections made until then. Credentials that cannot
be loaded then (STS unreachable for a while) leave the token in hand in use while it is good; after that, each
connection fails as one that could not be made, which aiokafka's clients retry.
"""

from __future__ import annotations

import asyncio
import threading
import time

import botocore.session
import structlog
from aiokafka.abc import AbstractTokenProvider
from aiokafka.errors import KafkaConnectionError
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
from botocore.credentials import CredentialProvider, Credentials
from botocore.exceptions import BotoCoreError, ClientError

__all__ = ["IamTokenUnavailable", "MskIamTokens"]

_RENEW_WITHIN = 1 / 3
"""The share of a token's life left when the next connection gets a new one."""

log = structlog.get_logger("burnwatch.kafka")


class IamTokenUnavailable(KafkaConnectionError):
    """No token can be made: the region is unknown, or no AWS credentials are found or can be loaded. The message
    says which, and what to set. A connection that could not be made, to aiokafka: its clients retry it (any other
    error ends the consumer's fetcher, the producer's sender or the metadata updates for good)."""

    __str__ = Exception.__str__  # the message alone, not aiokafka's "IamTokenUnavailable: ..."


class _Chain(CredentialProvider):
    """The AWS SDK's standard chain, resolved once by one botocore session: credentials that expire (IRSA's, an
    instance profile's) are refreshed by botocore as they near their end."""

    METHOD = "burnwatch-default-chain"

    def __init__(self) -> None:
        super().__init__()
        self._session = botocore.session.Session()

    def load(self) -> Credentials:
        try:
            found = self._session.get_credentials()
            frozen = found.get_frozen_credentials() if found is not None else None
        except (BotoCoreError, ClientError, OSError, RuntimeError) as exc:  # (OSError: IRSA's token file)
            raise IamTokenUnavailable(f"AWS credentials for AWS_MSK_IAM could not be loaded ({exc})") from None
        if frozen is None or not frozen.access_key or not frozen.secret_key:
            raise IamTokenUnavailable("no AWS credentials found for AWS_MSK_IAM: the AWS SDK's chain (AWS_ACCESS_KEY_ID "
                                      "and AWS_SECRET_ACCESS_KEY, IRSA's AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, "
                                      "AWS_PROFILE's files, the instance profile) gave none")  # fmt: skip
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


class MskIamTokens(AbstractTokenProvider):
    """aiokafka's token provider for MSK's IAM in ``region`` (None: not known, an error at the first connection)."""

    def __init__(self, region: str | None) -> None:
        self.region = region
        self._chain: _Chain | None = None
        self._token = ""
        self._expires_at = 0.0
        self._issued_at = 0.0
        self._lock = threading.Lock()
        """A thread's lock, taken off the event loops: one provider serves clients on several loops (Faust's consumer
        runs on a loop of its own, in a thread of its own), which an asyncio lock cannot."""

    async def token(self) -> str:
        return await asyncio.to_thread(self._current)  # (the chain may call STS or the IMDS)

    def _current(self) -> str:
        with self._lock:  # connections opened together share one token
            now = time.time()
            left = self._expires_at - now
            if self._token and left > (self._expires_at - self._issued_at) * _RENEW_WITHIN:
                return self._token
            try:
                token, expires_ms = self._make()
            except IamTokenUnavailable as exc:
                if self._token and left > 0:  # the one in hand is still good: try again at the next connection
                    log.warning("kafka_iam_token_not_renewed", error=str(exc), token_left_s=round(left))
                    return self._token
                raise
            self._token, self._issued_at, self._expires_at = token, now, expires_ms / 1000
            return self._token

    def _make(self) -> tuple[str, int]:
        if not self.region:
            raise IamTokenUnavailable("AWS_MSK_IAM needs the cluster's region: set BURNWATCH_KAFKA_AWS_REGION (the "
                                      "brokers' names do not say it, nor AWS_REGION or AWS_DEFAULT_REGION)")  # fmt: skip
        if self._chain is None:
            self._chain = _Chain()
        token, expires_ms = MSKAuthTokenProvider.generate_auth_token_from_credentials_provider(self.region, self._chain)
        return token, int(expires_ms)
