import contextlib
import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A URL whose TCP handshake never completes (a dead host, a firewall that drops packets): the listener's
    accept queue (backlog 0 holds one connection) is full and never drained, so Linux drops every further SYN."""
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(socket.socket())
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        for _ in range(2):  # the first fills the queue, the second waits in SYN_SENT as ours will
            filler = stack.enter_context(socket.socket())
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):  # non-blocking: the connect goes on in the kernel
                filler.connect(("127.0.0.1", port))
        yield f"http://127.0.0.1:{port}"


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A URL where the kernel completes the handshake and takes the request, but nothing ever answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def refused() -> Iterator[str]:
    """A URL where nothing listens (bound, not listening): the connection is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
