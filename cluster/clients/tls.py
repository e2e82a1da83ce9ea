"""TLS contexts for whoever dials a node: the client, the worker, the CLI and nodes asking each
other (DESIGN.md §8.3); and the node's own server context (`server_context`), which the HTTP
listener serves with and a starting node's peers check.

The server is always verified (certificate chain and host name): against ``ca_file`` when one
is given (``--ca-file``, env ``RAFTCRON_CA_FILE``), else the system's trust store. When a node
asks for client certificates (``[api] tls_client_ca_file``), ``cert_file`` and ``key_file``
(``--cert-file`` / ``--key-file``, env ``RAFTCRON_CERT_FILE`` / ``RAFTCRON_KEY_FILE``) are
presented.
"""

from __future__ import annotations

import os
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raftcron.cluster.config import ApiSettings

CA_FILE_ENV = "RAFTCRON_CA_FILE"
CERT_FILE_ENV = "RAFTCRON_CERT_FILE"
KEY_FILE_ENV = "RAFTCRON_KEY_FILE"
# The command-line flags of everything that dials a node: (flag, variable, help).
FLAGS = (
    ("--ca-file", CA_FILE_ENV, "CA certificates that https:// nodes are verified against"),
    ("--cert-file", CERT_FILE_ENV, "client certificate, for nodes that require one"),
    ("--key-file", KEY_FILE_ENV, "the client certificate's key"),
)


def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext | None:
    """A verifying client context, or None when nothing was configured (aiohttp then uses its
    default, which verifies against the system store too). Missing or bad files raise
    ValueError naming the setting."""
    ca_file = ca_file or os.environ.get(CA_FILE_ENV) or None
    cert_file = cert_file or os.environ.get(CERT_FILE_ENV) or None
    key_file = key_file or os.environ.get(KEY_FILE_ENV) or None
    if ca_file is None and cert_file is None and key_file is None:
        return None
    if (cert_file is None) != (key_file is None):
        raise ValueError("--cert-file and --key-file go together (RAFTCRON_CERT_FILE, "
                         "RAFTCRON_KEY_FILE)")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    try:
        if ca_file is not None:
            context.load_verify_locations(cafile=ca_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"--ca-file {ca_file}: {error}") from None
    try:
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(f"--cert-file {cert_file} / --key-file {key_file}: {error}") from None
    return context


def server_context(settings: ApiSettings) -> ssl.SSLContext | None:
    """A server context from the configured files (raises ssl.SSLError or OSError)."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_server_files(context, settings)
    return context


def load_server_files(context: ssl.SSLContext, settings: ApiSettings) -> None:
    """Load (or reload, on SIGHUP) the node's certificate, key and client CA into `context`."""
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_client_ca_file is not None:
        context.load_verify_locations(cafile=str(settings.tls_client_ca_file))
        context.verify_mode = ssl.CERT_REQUIRED
