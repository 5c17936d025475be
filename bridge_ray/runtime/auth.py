"""Joining a Ray cluster that uses token authentication: one ``error:`` line instead of 20 s of warnings and a
traceback.

Ray 2.60 turns token authentication on by itself only for a local cluster it starts or finds (``address`` None or
``auto``); a driver joining an explicit address sends its token only under ``RAY_AUTH_MODE=token``. Without it,
``ray.init`` retries the refused connection for 20 s (a ``gcs_client.cc`` warning a second) and then raises a
``ConnectionError`` whose cause quotes Ray's ``AuthenticationError``. So, when a token is at hand but the mode is
not ``token``, one quick handshake with the head tells before ``ray.init`` whether it asks for the token; and a
refusal ``ray.init`` meets anyway (a wrong or missing token) becomes the same kind of error.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ray
from ray._raylet import InnerGcsClient  # what ray.init's own connection attempts use

from bridge_ray.errors import InputError
from bridge_ray.runtime.placement import HIDE_UNRESERVED_GPUS

# How long the handshake may take: the head answers at once (an unreachable head is left to ray.init to report).
PROBE_TIMEOUT_MS = 2000
# What Ray's refusals read like, at any depth of the ConnectionError's chain (the cause quotes a traceback).
REFUSALS = ("AuthenticationError", "InvalidAuthToken", "Unauthenticated")


def init_ray(address: str | None, **kwargs: Any) -> Any:
    """``ray.init(address=address, **kwargs)`` under :data:`~bridge_ray.runtime.placement.HIDE_UNRESERVED_GPUS`
    (unless ``runtime_env`` is given), refusing with an :class:`InputError` (naming ``RAY_AUTH_MODE=token`` and
    ``ray get-auth-token``) a head that asks for a token this driver does not send."""
    kwargs.setdefault("runtime_env", HIDE_UNRESERVED_GPUS)
    if _joins_explicitly(address) and not _token_mode() and token_at_hand() and _head_refuses(address):
        raise auth_error(address, "RAY_AUTH_MODE is not 'token', so the token found here was not sent")
    try:
        return ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ray.exceptions.AuthenticationError) as exc:
        if not refused(exc):
            raise
        reason = ("RAY_AUTH_MODE is 'token', but no token was found or it is not the cluster's" if _token_mode()
                  else "RAY_AUTH_MODE is not 'token', so no token was sent")
        raise auth_error(address, reason) from None


def auth_error(address: str | None, reason: str) -> InputError:
    where = address or os.environ.get("RAY_ADDRESS") or "the local address"
    return InputError(
        f"the Ray cluster at {where} uses token authentication and refused this "
        f"driver ({reason}): run with RAY_AUTH_MODE=token and the cluster's token in RAY_AUTH_TOKEN (or "
        "~/.ray/auth_token, or the file RAY_AUTH_TOKEN_PATH names); `ray get-auth-token` on the head node prints it"
    )


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` or anything in its chain is Ray refusing this driver's authentication."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return any(isinstance(e, ray.exceptions.AuthenticationError) or any(r in str(e) for r in REFUSALS) for e in chain)


def token_at_hand() -> bool:
    """Whether this process has a token Ray would send under ``RAY_AUTH_MODE=token``: ``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return True
    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    return path.is_file() and path.stat().st_size > 0


def _token_mode() -> bool:
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


def _joins_explicitly(address: str | None) -> bool:
    """An address Ray will not turn token authentication on for: given, and neither ``auto``, ``local`` nor a Ray
    Client (``ray://``) address, whose server reports a refusal itself."""
    return address not in (None, "auto", "local") and not address.startswith("ray://")


def _head_refuses(address: str) -> bool:
    """One handshake with the head's GCS without a token: whether it answers with Ray's ``AuthenticationError``."""
    try:
        with _quiet_stderr():  # the C++ client logs the refusal it is about to raise as a warning line
            InnerGcsClient.standalone(address, None, PROBE_TIMEOUT_MS)
    except ray.exceptions.AuthenticationError:
        return True
    except Exception:  # unreachable, or not a Ray head: ray.init reports it in its own words
        return False
    return False


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for a moment (Ray's C++ logging writes to it directly)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
