"""Ports: a free TCP port for a server, a rendezvous or a process group to listen on."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at ``host`` now (``""``: every interface); the OS picks it."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
