"""Loopback ports: whether one is free, and one that nothing listens on right now."""

from __future__ import annotations

import socket

from tidepool.errors import TidepoolError


class PortInUse(TidepoolError):
    """A port the server needs is taken; says which and how to choose another."""


def check_port_free(host: str, port: int, flag: str) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise PortInUse(
                f"port {port} on {host} is in use ({exc.strerror}); stop what holds it "
                f"(another tritonserver?) or choose another with {flag}"
            ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on right now (for tests and side-by-side servers)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
