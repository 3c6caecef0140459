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

import json
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


# --- per-node discovery users (infra/nats/auth.conf) -------------------------------------

NODE_USERS_MARKER = "    # per-node discovery users: python -m dralloc.natsauth nodes NODE..."


def node_password_variable(node: str) -> str:
    """The server-side environment variable holding node `node`'s discovery password."""
    return "DRALLOC_NODE_" + re.sub(r"[^A-Z0-9]", "_", node.upper()) + "_NATS_PASSWORD"


def node_user(node: str) -> str:
    """An auth.conf user block for node `node`'s discovery (user ``discovery-<node>``): it may publish
    only that node's slices (their pool is the node's name) and its Node object, and read INVENTORY.
    A leaked node credential can then misreport that one node, never another's devices."""
    from dralloc.schemas import events  # the subjects are the events' own encoding

    pool = events.subject("inventory", "DRIVER", node, "SLICE").split(".")[3]
    own = events.subject("nodes", node)
    allow = [
        f"dra.inventory.*.{pool}.*",
        own,
        "$JS.API.INFO",
        *(f"$JS.API.STREAM.INFO.{s}" for s in ("INVENTORY", "CLAIMS", "ALLOCATIONS", "DEADLETTER")),
        "$JS.API.CONSUMER.CREATE.INVENTORY.*",
        "$JS.API.CONSUMER.CREATE.INVENTORY.*.>",
        "$JS.API.CONSUMER.INFO.INVENTORY.*",
        "$JS.API.CONSUMER.MSG.NEXT.INVENTORY.*",
        "$JS.ACK.INVENTORY.>",
    ]
    lines = [
        "    {",
        f"      # node {node}: its own slices and Node object only",
        f"      user: {json.dumps('discovery-' + node)}, password: ${node_password_variable(node)}",
        "      permissions: {",
        "        publish: { allow: [" + ", ".join(json.dumps(s) for s in allow) + "] }",
        '        subscribe: { allow: ["_INBOX.>"] }',
        "      }",
        "    }",
    ]
    return "\n".join(lines)


def with_node_users(auth_conf: str, nodes: list[str]) -> str:
    """`auth_conf` (infra/nats/auth.conf's text) with a `node_user` per node at its marker.
    Raises ValueError for an empty or repeated node name, or two whose password variables collide."""
    if NODE_USERS_MARKER not in auth_conf:
        raise ValueError("no per-node marker in the auth.conf given (is it infra/nats/auth.conf?)")
    seen: dict[str, str] = {}
    for node in nodes:
        if not node or any(c.isspace() or c in "\"'\\$" for c in node):
            raise ValueError(f"node name {node!r}: not a Kubernetes node name")
        variable = node_password_variable(node)
        if variable in seen:
            raise ValueError(f"nodes {seen[variable]!r} and {node!r} would share the password variable {variable}")
        seen[variable] = node
    return auth_conf.replace(NODE_USERS_MARKER, "\n".join([*(node_user(n) for n in nodes), NODE_USERS_MARKER]))


def _main(argv: list[str]) -> int:
    """``python -m dralloc.natsauth nodes NODE... [--auth infra/nats/auth.conf]``: print auth.conf with
    per-node discovery users."""
    import sys

    from dralloc.manifests import read_text  # (the one bounded reader of a file someone names)

    args = list(argv)
    path = Path(__file__).resolve().parents[1] / "infra" / "nats" / "auth.conf"
    if "--auth" in args:
        i = args.index("--auth")
        if i + 1 >= len(args):
            print("--auth needs a file", file=sys.stderr)
            return 2
        path = Path(args[i + 1])
        del args[i : i + 2]
    if not args or args[0] != "nodes" or len(args) < 2:
        print("usage: python -m dralloc.natsauth nodes NODE... [--auth AUTH_CONF]", file=sys.stderr)
        return 2
    try:
        print(with_node_users(read_text(path), args[1:]), end="")
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
