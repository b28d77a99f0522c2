"""Is the Hugging Face hub reachable? Asked before `datasets` (which retries ~25 s, then says "not cached
in None"); when not, `datasets` goes offline so a dataset in the local cache still loads."""

from __future__ import annotations

import os
import socket
import sys
import threading
from urllib.parse import urlsplit

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0
_TRUE = {"1", "on", "yes", "true"}


def offline_reason(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be used ("HF_HUB_OFFLINE=1 is set", "huggingface.co does not resolve"), or None:
    HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, or HF_ENDPOINT not resolving or connecting (unless a proxy is set)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").strip().lower() in _TRUE:
            return f"{var}={os.environ[var]} is set"
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                                       "all_proxy")):
        return None  # through a proxy a direct resolve/connect proves nothing: let `datasets` try
    endpoint = os.environ.get("HF_ENDPOINT", "").strip() or DEFAULT_ENDPOINT
    parts = urlsplit(endpoint)
    host = parts.hostname
    if not host:
        return f"HF_ENDPOINT={endpoint!r} is not a URL"
    try:
        port = parts.port or (80 if parts.scheme == "http" else 443)
    except ValueError:  # urlsplit reads the port lazily: "host:abc" or one past 65535
        return f"HF_ENDPOINT={endpoint!r} has no valid port: give a number from 1 to 65535, or none"
    addr = _resolve(host, port, timeout_s)
    if isinstance(addr, str):
        return f"{host} does not resolve: {addr}"
    try:
        socket.create_connection(addr, timeout=timeout_s).close()
    except OSError as e:
        return f"{host}:{port} does not accept a connection: {e.strerror or type(e).__name__}"
    return None


def _resolve(host: str, port: int, timeout_s: float) -> tuple[str, int] | str:
    """(address, port), or the resolver's error text; getaddrinfo has no timeout, so a thread waits for it."""
    result: list[tuple[str, int] | str] = []

    def lookup() -> None:
        try:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            result.append((str(info[0][4][0]), port))
        except OSError as e:
            result.append(str(e.strerror or e))

    t = threading.Thread(target=lookup, daemon=True)
    t.start()
    t.join(timeout_s)
    return result[0] if result else f"no answer within {timeout_s:g} s"


def go_offline() -> None:
    """Make `datasets` / `huggingface_hub` use the local cache only (before or after their import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    for module, attr in (("huggingface_hub.constants", "HF_HUB_OFFLINE"), ("datasets.config", "HF_HUB_OFFLINE"),
                         ("datasets.config", "HF_DATASETS_OFFLINE")):
        if module in sys.modules and hasattr(sys.modules[module], attr):
            setattr(sys.modules[module], attr, True)
