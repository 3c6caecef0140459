"""Credentials and TLS for every dralloc connection to NATS, from the environment (one place).

Read by `dralloc.bus.Bus.connect`, so every service and command gets them:

- ``NATS_USER`` / ``NATS_PASSWORD``: user and password (or in the URL,
  ``nats://user:password@host:4222``);
- ``NATS_TOKEN``: a token;
- ``NATS_CREDS``: a ``.creds`` file (user JWT and nkey seed, for operator/JWT
  accounts), or ``NATS_NKEY``: a file holding an nkey seed;
- ``NATS_TLS_CA``: CA bundle to verify the server with (turns TLS on; so does
  a ``tls://`` URL, with the system's CAs); ``NATS_TLS_CERT`` and
  ``NATS_TLS_KEY``: a client certificate for mutual TLS;
  ``NATS_TLS_HOSTNAME``: the name to verify when the URL's host differs.

infra/nats/auth.conf gives each service a user that may publish and
subscribe only its own subjects.
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact(text: str) -> str:
    """`text` with the user information of every URL in it (``user:password@``, ``token@``)
    replaced by ``***@``: what may be logged or shown of a NATS URL."""
    return _USERINFO.sub(r"\g<scheme>***@", text)


class AuthConfigError(ValueError):
    """A NATS_* security setting that cannot work; the message names the variable."""


def _file(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if not value:
        return None
    if not Path(value).is_file():
        raise AuthConfigError(f"{name}={value}: no such file")
    return value


def connect_options(url: str, env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Keyword arguments for ``nats.NATS.connect`` from the NATS_* variables."""
    options: dict[str, Any] = {}
    if env.get("NATS_USER"):
        options["user"] = env["NATS_USER"]
        options["password"] = env.get("NATS_PASSWORD", "")
    if env.get("NATS_TOKEN"):
        options["token"] = env["NATS_TOKEN"]
    if creds := _file(env, "NATS_CREDS"):
        options["user_credentials"] = creds
    if nkey := _file(env, "NATS_NKEY"):
        options["nkeys_seed"] = nkey
    if creds or nkey:
        try:
            import nkeys  # noqa: F401  (nats-py signs the server's nonce with it)
        except ImportError:
            raise AuthConfigError("NATS_CREDS / NATS_NKEY need the nkeys package (pip install nkeys)") from None
    ca, cert, key = _file(env, "NATS_TLS_CA"), _file(env, "NATS_TLS_CERT"), _file(env, "NATS_TLS_KEY")
    if bool(cert) != bool(key):
        raise AuthConfigError("NATS_TLS_CERT and NATS_TLS_KEY go together (a client certificate and its key)")
    if ca or cert or url.startswith("tls://"):
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        if cert:
            try:
                context.load_cert_chain(cert, key)
            except ssl.SSLError as exc:
                raise AuthConfigError(f"NATS_TLS_CERT/NATS_TLS_KEY: cannot load: {exc.reason or exc}") from None
        options["tls"] = context
        if env.get("NATS_TLS_HOSTNAME"):
            options["tls_hostname"] = env["NATS_TLS_HOSTNAME"]
    return options
