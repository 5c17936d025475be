"""Where a torch.distributed group meets: rank 0's node address and a port that is free there."""

from __future__ import annotations

import socket

import ray


def free_port() -> int:
    """A TCP port the OS reports free on this node (bound and released; the group binds it right after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def rendezvous_address() -> tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)`` for a group whose rank 0 runs in this process."""
    return ray.util.get_node_ip_address(), free_port()
