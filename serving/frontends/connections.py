"""Connection limits of the HTTP servers (``funnel serve``, ``funnel mcp --transport
streamable-http``): how long a client may take to send a request's head, how long an idle
keep-alive connection stays open, and how many connections are held at once.

uvicorn bounds neither of the first two by itself: a connection that sends nothing, or
trickles its request line and headers a byte at a time, is held for ever (its keep-alive
timer starts only after a response, and any byte cancels it), so a few hundred such
clients hold a few hundred descriptors. `uvicorn_config` gives uvicorn an HTTP
protocol (`BoundedH11Protocol`, uvicorn's h11 protocol with a deadline added) that

- from the moment a connection opens, and again from the end of each response, allows
  ``header_timeout_s`` seconds for a whole request head (request line and headers) to
  arrive; past it the connection is closed, with a 408 if part of a head had come;
- closes a connection idle ``keep_alive_s`` seconds after a response (uvicorn's own
  ``timeout_keep_alive``);
- refuses a connection beyond ``max_connections`` open at once with a 503 and closes it.

A request body has its own bound (``http.RequestGuard``: 408 after ``--body-timeout``).
The head is also bounded in size by h11 (16 KiB: a larger one is a 400).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

#: Seconds a client has to send a request's line and headers, from the moment its connection
#: opens or its previous response ends. A real client sends them in one packet.
DEFAULT_HEADER_TIMEOUT_S = 10.0
#: Seconds an idle keep-alive connection stays open after a response (uvicorn's default).
DEFAULT_KEEP_ALIVE_S = 5.0
#: Connections held at once; more are answered 503 and closed. Each holds a descriptor, and a
#: process commonly gets 1,024 of them, part of which the index's memory maps take.
DEFAULT_MAX_CONNECTIONS = 256
MAX_CONNECTIONS_CAP = 65_536
#: Seconds a connection answered 408 stays half-open (our side closed for writing), reading and
#: dropping what the client still sends, before it is closed: closing at once makes the
#: client's next bytes draw a reset, which discards the 408 unread on the client's side.
LINGER_S = 1.0


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number of seconds above 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds on one server's connections (module docstring), checked when made.

    Raises
    ------
    ValueError
        A timeout that is not a finite number above 0, or a connection count outside
        1..``MAX_CONNECTIONS_CAP``.
    """

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __post_init__(self) -> None:
        object.__setattr__(self, "header_timeout_s", _seconds("header_timeout_s (--header-timeout)",
                                                              self.header_timeout_s))
        object.__setattr__(self, "keep_alive_s", _seconds("keep_alive_s (--keep-alive-timeout)", self.keep_alive_s))
        n = self.max_connections
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CONNECTIONS_CAP:
            raise ValueError(f"max_connections (--max-connections) must be an integer from 1 to "
                             f"{MAX_CONNECTIONS_CAP:,}, got {n!r}")


def _raw_response(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response written before h11 has seen a request (it cannot send one then)."""
    body = json.dumps({"error": message}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head and a cap on connections
    (module docstring). ``limits`` is set on the subclass `protocol_for` makes."""

    limits: ConnectionLimits = ConnectionLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = False
        self._lingering = False
        if len(self.server_state.connections) >= self.limits.max_connections:
            self.transport = transport
            log.warning("refused a connection: %d are open, the limit (--max-connections)",
                        len(self.server_state.connections))
            transport.write(_raw_response(503, "Service Unavailable",
                                          f"too many connections: {self.limits.max_connections} are open "
                                          "(--max-connections); try again shortly"))
            transport.close()
            return
        super().connection_made(transport)
        self._arm_head_deadline()

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_bytes = False
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # answered 408 and closing: dropped
        if self._head_timer is not None and data:
            self._head_bytes = True
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._cancel_head_deadline()  # the request head is in: the body and the app have their own bounds

    def on_response_complete(self) -> None:
        # Armed before uvicorn looks at pipelined data, which may hold the next head already.
        self._arm_head_deadline()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        if self.connections is not None and self not in self.connections:
            self.transport.close()  # a refused connection: uvicorn never counted it
            return
        super().connection_lost(exc)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._head_bytes:
            self.transport.write(_raw_response(
                408, "Request Timeout", f"request head incomplete: the request line and headers must arrive "
                                        f"within {self.limits.header_timeout_s:g} s (--header-timeout)"))
            if self.transport.can_write_eof():
                # A lingering close (LINGER_S): the 408 and our end of the stream go out now; the
                # connection closes when the client closes or LINGER_S later, whichever is first.
                self._lingering = True
                self.transport.write_eof()
                self.loop.call_later(LINGER_S, self.transport.close)
                return
        self.transport.close()


def protocol_for(limits: ConnectionLimits) -> type[BoundedH11Protocol]:
    """A `BoundedH11Protocol` subclass bound to ``limits`` (uvicorn makes one instance
    per connection from the class it is given)."""
    return type("BoundedH11Protocol", (BoundedH11Protocol,), {"limits": limits})


def uvicorn_config(app, host: str, port: int, limits: ConnectionLimits | None = None, log_level: str = "warning"):
    """A ``uvicorn.Config`` serving ``app`` under ``limits`` (default `ConnectionLimits`)."""
    import uvicorn
    limits = limits or ConnectionLimits()
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, http=protocol_for(limits),
                          timeout_keep_alive=limits.keep_alive_s)
