"""A throwaway nginx in front of a schema registry: TLS, basic auth and a bearer token.

Owns writing its configuration and TLS material (a CA of its own and a certificate for
127.0.0.1: cdc_relay/local/kafka_security.py's ``make_tls``) in a temp dir, running
Debian's ``nginx`` (``apt-get install nginx-light``; scripts/bootstrap.sh installs it
without starting the service) in the foreground on free 127.0.0.1 ports, and stopping it
by its own PID. Two HTTPS ports proxy to the upstream registry: ``basic_url`` asks for
HTTP basic auth (``user`` / ``password``), ``bearer_url`` for ``Authorization: Bearer
<token>``; anything else is answered 401 (nginx's own HTML page, as a real proxy does).
``forbid_registration(True)`` makes the basic-auth port answer 403 to registering a schema
(a user without write access to the subjects) and ``False`` grants it again: the config is
rewritten and our nginx reloaded (SIGHUP to its PID).

Used by the tests of the relay against a protected registry (docs/messages.md, schema
registry). Must not touch the system's nginx service, its configuration or its logs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import ssl
import subprocess
import tempfile
from pathlib import Path
from typing import Self

from cdc_relay.errors import LocalServiceError
from cdc_relay.local.helpers import HOST, OwnedServer, free_port, tail, wait_serving

DEFAULT_BINARY = "/usr/sbin/nginx"


class RegistryProxy(OwnedServer):
    """nginx proxying ``upstream`` (``http://host:port``) behind TLS and credentials."""

    def __init__(self, upstream: str, *, user: str = "relay", password: str = "s3cret-pw",
                 token: str = "t0ken-abc", binary: str = DEFAULT_BINARY) -> None:
        self.upstream = upstream.rstrip("/")
        self.user, self.password, self.token = user, password, token
        self._binary = binary
        self._tmp: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.basic_port = self.bearer_port = 0
        self.forbidden = False
        self._keystore = Path()
        self.ca = Path()

    def url(self, port: int, path: str = "/apis/ccompat/v7") -> str:
        return f"https://{HOST}:{port}{path}"

    @property
    def basic_url(self) -> str:
        """The registry's Confluent-compatible API behind basic auth."""
        return self.url(self.basic_port)

    @property
    def bearer_url(self) -> str:
        """The registry's Confluent-compatible API behind a bearer token."""
        return self.url(self.bearer_port)

    def start(self) -> Self:
        from cdc_relay.local.kafka_security import make_tls

        if not os.access(self._binary, os.X_OK):
            raise LocalServiceError(f"nginx not found at {self._binary}: apt-get install nginx-light")
        tmp = self._tmp = Path(tempfile.mkdtemp(prefix="cdc-relay-nginx-"))
        tls = make_tls(tmp / "tls")
        self.ca = tls.ca
        self.basic_port, self.bearer_port = free_port(), free_port()
        (tmp / "htpasswd").write_text(f"{self.user}:{{PLAIN}}{self.password}\n", encoding="utf-8")
        self._keystore = tls.keystore
        (tmp / "nginx.conf").write_text(self._config(), encoding="utf-8")
        self._proc = subprocess.Popen(
            [self._binary, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        try:
            for port in (self.basic_port, self.bearer_port):
                if not wait_serving(self._proc, port, functools.partial(self._answers, port), timeout=20):
                    raise LocalServiceError(f"another process took port {port}")
        except (TimeoutError, LocalServiceError) as exc:
            log = tail(tmp / "error.log")
            self.stop()
            raise LocalServiceError(f"nginx did not start ({exc}):\n{log}") from exc
        return self

    def forbid_registration(self, forbidden: bool) -> None:
        """Answer 403 to POST …/versions on the basic-auth port (or no more); reload."""
        assert self._tmp is not None and self._proc is not None
        self.forbidden = forbidden
        (self._tmp / "nginx.conf").write_text(self._config(), encoding="utf-8")
        self._proc.send_signal(signal.SIGHUP)

    def _config(self) -> str:
        tmp, keystore = self._tmp, self._keystore
        assert tmp is not None
        user = "user root root;\n" if os.geteuid() == 0 else ""  # workers read the files
        proxy = f"proxy_pass {self.upstream}; proxy_set_header Authorization \"\";"
        common = (f"    ssl_certificate {keystore};\n    ssl_certificate_key {keystore};\n"
                  f"    location / {{ {proxy} }}\n")
        forbid = (f"    location ~ /versions$ {{ limit_except GET {{ deny all; }} {proxy} }}\n"
                  if self.forbidden else "")
        return (
            f"{user}daemon off;\nmaster_process on;\nworker_processes 1;\npid {tmp}/nginx.pid;\n"
            f"error_log {tmp}/error.log warn;\nevents {{ worker_connections 64; }}\nhttp {{\n"
            f"  access_log off;\n  client_body_temp_path {tmp}/body;\n"
            f"  proxy_temp_path {tmp}/proxy;\n  fastcgi_temp_path {tmp}/fastcgi;\n"
            f"  uwsgi_temp_path {tmp}/uwsgi;\n  scgi_temp_path {tmp}/scgi;\n"
            f"  server {{\n    listen {HOST}:{self.basic_port} ssl;\n"
            f"    auth_basic \"schema registry\";\n    auth_basic_user_file {tmp}/htpasswd;\n"
            f"{forbid}{common}  }}\n"
            f"  server {{\n    listen {HOST}:{self.bearer_port} ssl;\n"
            f"    if ($http_authorization != \"Bearer {self.token}\") {{ return 401; }}\n"
            f"{common}  }}\n}}\n")

    def _answers(self, port: int) -> bool:
        context = ssl.create_default_context(cafile=str(self.ca))
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5) as sock, \
                context.wrap_socket(sock, server_hostname=HOST):
            return True
        return False
