"""Talking to nodes over HTTP: `client` and `asyncclient` (the public `Client` and
`AsyncClient`, with `clientparts` what they share: retries across nodes, errors), `tls` (the
TLS contexts of both sides) and `peerhttp` (how a node dials another member).
"""
