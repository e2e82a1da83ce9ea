"""A throwaway certificate authority for local clusters (`raftcron demo --tls`, the TLS tests):
a CA, and certificates it signs for 127.0.0.1 (servers) or a name (clients).

It runs the `openssl` command (Debian's openssl package; `.ci/run` installs it) rather than
adding a cryptography library to the product for what only tools need. Keys are unencrypted
and valid for two days: never for anything but loopback.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path


class CertsError(Exception):
    pass


class LocalCA:
    def __init__(self, folder: Path, *, name: str = "raftcron local CA") -> None:
        if shutil.which("openssl") is None:
            raise CertsError("the openssl command is needed to make certificates (apt-get "
                             "install openssl)")
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.cert = folder / "ca.pem"
        self.key = folder / "ca.key"
        self._openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                      "-nodes", "-keyout", self.key, "-out", self.cert, "-days", "2",
                      "-subj", f"/CN={name}")

    def issue(self, name: str, *, server: bool, client: bool = False) -> tuple[Path, Path]:
        """(certificate, key) for a server (127.0.0.1), a client, or both (a node whose peers
        ask for client certificates shows its own)."""
        key, csr, cert = (self.folder / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        extensions = self.folder / f"{name}.ext"
        usage = ",".join(u for u, wanted in (("serverAuth", server), ("clientAuth", client))
                         if wanted)
        extensions.write_text(
            ("subjectAltName=IP:127.0.0.1\n" if server else "") + f"extendedKeyUsage={usage}\n")
        self._openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                      "-nodes", "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        self._openssl("x509", "-req", "-in", csr, "-CA", self.cert, "-CAkey", self.key,
                      "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", extensions)
        return cert, key

    def context(self, client_cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client context that trusts this CA (and shows `client_cert` when given)."""
        context = ssl.create_default_context(cafile=str(self.cert))
        if client_cert is not None:
            context.load_cert_chain(*client_cert)
        return context

    def _openssl(self, *args: object) -> None:
        try:
            subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True,
                           timeout=60)
        except subprocess.CalledProcessError as error:
            raise CertsError(f"openssl {args[0]} failed: {error.stderr.decode()[-500:]}") from None
