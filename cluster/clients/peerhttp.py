"""How a node dials another member's HTTP API (DESIGN.md §8.3): the scheme, the TLS context and
the credential, decided once per node (`Node` builds one `PeerDialer` at start).

Nodes ask each other two things: their clocks (`GET /healthz`, cluster/clock/clockpoll.py; open, so
no credential is sent) and their cluster view (`GET /v1/cluster`, for `?members=1`). When this
node serves HTTPS its peers do too (one `[api]` section for the whole cluster), so they are
dialled over HTTPS and verified against the client CA (or `RAFTCRON_CA_FILE`, or the system
store); when the cluster asks for client certificates this node shows its own. The credential
is the nodes' own peer token (`peer_token`), never a user's: every member derives it from the
cluster password, and the HTTP API gives it the role `peer` (cluster/http/common.py).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ssl
from dataclasses import dataclass, field

from raftcron.cluster.clients import tls
from raftcron.cluster.config import ConfigError, NodeConfig

_PEER_CONTEXT = b"raftcron http peer credential v1"


@functools.cache
def peer_token(cluster_password: str | None) -> str | None:
    """The bearer token nodes of one cluster use with each other: an HMAC of the cluster
    password, so every member derives the same one and it reveals nothing of the password.
    (Cached: every authenticated request compares against it.)"""
    if not cluster_password:
        return None
    return hmac.new(cluster_password.encode(), _PEER_CONTEXT, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PeerDialer:
    scheme: str
    context: ssl.SSLContext | None  # None: plain HTTP
    headers: dict[str, str] = field(default_factory=dict)  # the peer credential

    def url(self, http_address: str, path: str) -> str:
        return f"{self.scheme}://{http_address}{path}"

    @property
    def ssl(self) -> ssl.SSLContext | bool:
        """What aiohttp's `ssl=` takes: the context, or True (its default checks) for HTTP."""
        return True if self.context is None else self.context


def peer_dialer(config: NodeConfig) -> PeerDialer:
    """This node's dialer; ConfigError naming the file when a TLS file does not load."""
    token = peer_token(config.cluster_password)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    api = config.api
    if not api.tls:
        return PeerDialer("http", None, headers)
    mutual = api.tls_client_ca_file is not None
    try:
        context = tls.client_context(
            str(api.tls_client_ca_file) if mutual else None,
            str(api.tls_cert_file) if mutual else None,
            str(api.tls_key_file) if mutual else None,
        ) or ssl.create_default_context()
    except ValueError as error:  # a file that cannot be read, named by the error
        raise ConfigError("api", f"the peers cannot be dialled over HTTPS: {error} (the CA "
                          f"is [api] tls_client_ca_file, else {tls.CA_FILE_ENV})") from None
    return PeerDialer("https", context, headers)
