"""The SASL OAUTHBEARER tokens of Amazon MSK's IAM access control (:data:`detector.kafka_security.AWS_MSK_IAM`).

A token is a URL presigned for ``kafka-cluster:Connect`` in the cluster's region with the AWS credentials the
process finds by the AWS SDK's standard chain (``AWS_*`` variables, IRSA's web identity on EKS, the shared files,
the instance profile), made by AWS's own signer (``aws-msk-iam-sasl-signer-python``), good for 15 minutes; shared
and renewed as every token is (:class:`streams.kafka_tokens.SharedTokens`). A module of its own, imported at the first
use: botocore took ~80 ms of every Kafka command's start.
"""

from __future__ import annotations

import botocore.session
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
from botocore.credentials import CredentialProvider, Credentials
from botocore.exceptions import BotoCoreError, ClientError

from streams.kafka_tokens import SharedTokens, TokenUnavailable

__all__ = ["MskIamTokens"]


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
            raise TokenUnavailable(f"AWS credentials for AWS_MSK_IAM could not be loaded ({exc})",
                                   transient=True) from None  # (STS or the metadata service unreachable: may pass)
        if frozen is None or not frozen.access_key or not frozen.secret_key:
            raise TokenUnavailable("no AWS credentials found for AWS_MSK_IAM: the AWS SDK's chain (AWS_ACCESS_KEY_ID "
                                   "and AWS_SECRET_ACCESS_KEY, IRSA's AWS_ROLE_ARN and AWS_WEB_IDENTITY_TOKEN_FILE, "
                                   "AWS_PROFILE's files, the instance profile) gave none")  # fmt: skip
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


class MskIamTokens(SharedTokens):
    """aiokafka's token provider for MSK's IAM in ``region`` (None: not known, an error at the first connection)."""

    def __init__(self, region: str | None) -> None:
        super().__init__()
        self.region = region
        self._chain: _Chain | None = None

    def _make(self) -> tuple[str, float]:
        if not self.region:
            raise TokenUnavailable("AWS_MSK_IAM needs the cluster's region: set BURNWATCH_KAFKA_AWS_REGION (the "
                                   "brokers' names do not say it, nor AWS_REGION or AWS_DEFAULT_REGION)")  # fmt: skip
        if self._chain is None:
            self._chain = _Chain()
        token, expires_ms = MSKAuthTokenProvider.generate_auth_token_from_credentials_provider(self.region, self._chain)
        return token, int(expires_ms) / 1000
