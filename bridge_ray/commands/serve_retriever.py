"""``bridge-ray serve-retriever``: the Search-R1-compatible ``POST /retrieve`` over a built index."""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import ray
import uvicorn

from bridge_ray.cli import add_config_arguments, config_from_args
from bridge_ray.config import RetrievalConfig, ShardHolderRole
from bridge_ray.errors import InputError
from bridge_ray.retrieval.client import RetrieverClient, ShardSet
from bridge_ray.retrieval.encoder import QueryEncoder
from bridge_ray.retrieval.server import ServerLimits, create_app
from bridge_ray.shard_holder.group import start_shard_holders
from bridge_ray.train.preflight import serve_preflight


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", required=True, metavar="DIR", help="index directory (retrieval.index.dir)")
    parser.add_argument("--adapter", metavar="DIR", help="peft query adapter (adapter_config.json + safetensors)")
    parser.add_argument(
        "--host",
        help="bind address (retrieval.server.host, default 127.0.0.1); the server has no authentication, "
        "so any other address exposes it to the network",
    )
    parser.add_argument("--port", type=int, help="port (retrieval.server.port)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help="recompute every index file's checksum before serving (retrieval.index.verify=always)",
    )
    parser.add_argument(
        "--ray",
        action="store_true",
        help="serve the shards from shard-holder actors (joins RAY_ADDRESS, else starts Ray locally)",
    )
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(
        args,
        {
            "retrieval.index.dir": args.index,
            "retrieval.server.host": args.host,
            "retrieval.server.port": args.port,
            "retrieval.index.verify": "always" if args.verify else None,
        },
    )

    serve_preflight(cfg, args.adapter)  # before the encoder loads: a bad index or adapter fails in a second
    r = cfg.retrieval
    sock = bind(r.server.host, r.server.port)  # before the index loads: a taken port fails fast
    try:
        client = load_client(
            r, args.adapter, cfg.roles.shard_holder if args.ray else None, cfg.algorithm.retriever.candidates
        )
        app = create_app(client, ServerLimits(**r.server.model_dump(exclude={"host", "port"})))
        sock.listen()  # connections queue from here on, so the line below is true when printed
        warn_if_exposed(sock, r.server.host)
        port = sock.getsockname()[1]  # the one the OS chose for --port 0
        print(
            f"serving {client.num_passages} passages from {r.index.dir} at http://{r.server.host}:{port}/retrieve",
            flush=True,
        )
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    finally:
        sock.close()
    return 0


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or an :class:`InputError` naming the flag when that is impossible."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    except socket.gaierror as exc:
        raise InputError(f"--host {host} (retrieval.server.host) does not resolve: {exc.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart may reuse the port at once
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise InputError(
                f"port {port} on {host} is in use; stop what holds it or pass another --port (retrieval.server.port)"
            ) from None
        raise InputError(f"cannot listen on {host}:{port} (--host/--port): {exc.strerror}") from None
    return sock


def warn_if_exposed(sock: socket.socket, host: str) -> None:
    """The server has no authentication: say so on stderr when it listens beyond this machine."""
    address = sock.getsockname()[0]
    if not ipaddress.ip_address(address).is_loopback:
        print(
            f"warning: --host {host} listens on {address}, not loopback: the server has no authentication, "
            "so anyone who can reach this machine over the network can query it",
            file=sys.stderr,
            flush=True,
        )


def load_client(
    r: RetrievalConfig, adapter: str | None, holders: ShardHolderRole | None, candidates: str = "adapted"
) -> RetrieverClient:
    """The encoder and the index's shards, in shard-holder actors of ``holders``' resources when given, picking
    candidates as the adapter was trained to (``algorithm.retriever.candidates``); a bad index or adapter is an
    :class:`InputError`, never a traceback."""
    with blamed_on("--adapter", adapter) if adapter else blamed_on("retrieval.encoder.name", r.encoder.name):
        encoder = QueryEncoder.from_config(r, adapter_dir=adapter)
    with blamed_on("--index", r.index.dir):
        shards = ray_shards(r, encoder, holders) if holders else local_shards(r, encoder)
        return RetrieverClient(
            encoder, shards, num_candidates=r.server.max_topk, num_shown=r.server.default_topk, candidates=candidates
        )


@contextmanager
def blamed_on(flag: str, value: str) -> Iterator[None]:
    """A file that cannot be read (missing, a model ``from_pretrained`` cannot load) or a ``ValueError``
    (``IndexMismatchError``, a corrupt file) as an InputError naming ``flag``."""
    try:
        yield
    except InputError:
        raise
    except (OSError, ValueError) as exc:
        raise InputError(str(exc) if value in str(exc) else f"{flag} {value}: {exc}") from exc


def local_shards(r: RetrievalConfig, encoder: QueryEncoder) -> ShardSet:
    return ShardSet.local(r.index.dir, encoder.spec, **r.index.search_options())


def ray_shards(r: RetrievalConfig, encoder: QueryEncoder, holders: ShardHolderRole) -> ShardSet:
    """Shard-holder actors on the Ray cluster of ``RAY_ADDRESS`` (or a running local one, as Ray finds it), else on
    a local one started here."""
    ray.init()
    holders = start_shard_holders(
        r.index.dir,
        encoder.spec,
        num_cpus=holders.cpus,
        num_gpus=holders.gpus,
        max_restarts=holders.max_restarts,
        timeout_s=holders.startup_timeout_s,
        **r.index.search_options(),
    )
    return ShardSet(holders)
