"""A real webhook receiver for the outbox tests: an HTTP server on 127.0.0.1 whose handler applies each
message's effect in its own database (not the queue's) with :mod:`skiplock.dedup`, the way a user's
receiver would. Every request is recorded, so tests count deliveries and effects separately.

A test scripts the receiver with ``receiver.script = fn(request) -> Action``: the status to answer,
whether to apply the effect first, how long to hang, or an event to block on (to freeze a delivery
between "effect committed" and "response sent").
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import unquote

import psycopg
from psycopg_pool import ConnectionPool

from skiplock import dedup

SCOPE = "test-receiver"


@dataclass
class Request:
    idempotency_key: str | None
    message_id: int
    attempt: int
    topic: str
    key: str | None
    payload: Any
    received_at: float = field(default_factory=time.monotonic)


@dataclass
class Action:
    status: int = 200
    apply: bool = True  # apply the effect (deduplicated) before answering; only for 2xx
    hang: float = 0.0  # seconds to wait before answering (after applying)
    hold: threading.Event | None = None  # block here after applying until set (see Receiver.held)
    body: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers (e.g. Retry-After)


class Receiver:
    def __init__(self, dsn: str):
        self.dsn = dsn
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("DROP TABLE IF EXISTS effects, skiplock_dedup")  # a clean receiver for each test
            dedup.install(c)
            c.execute("CREATE TABLE effects (seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                      "idempotency_key text NOT NULL, message_id bigint NOT NULL, topic text NOT NULL, key text, "
                      "payload jsonb)")
        self.pool = ConnectionPool(dsn, min_size=1, max_size=40, open=True, name="test-receiver")
        self.requests: list[Request] = []
        self.lock = threading.Lock()
        self.script: Callable[[Request], Action] | None = None
        self.held = threading.Event()  # set when a request reaches an Action.hold
        self.in_flight: dict[str, int] = {}  # per ordering key: requests being handled right now
        self.max_in_flight_per_key = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, like a real webhook endpoint
            disable_nagle_algorithm = True  # no 40 ms delayed-ACK stall between header and body writes

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    json.loads(body)
                except ValueError:  # the sender died mid-request: not a delivery
                    self.close_connection = True
                    return
                status, text, extra = receiver.handle(self.headers, body)
                data = text.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "text/plain")
                    for name, value in extra.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (timeout) or died: nothing to answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            # not socketserver's 5: a relay opening its connections at once would overflow it, and a
            # dropped SYN waits a full second for its retransmit
            request_queue_size = 128

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that died or timed out mid-request (the tests make them on purpose)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="test-receiver", daemon=True)
        self._thread.start()

    def handle(self, headers: Any, body: bytes) -> tuple[int, str, dict[str, str]]:
        key_header = headers.get("Skiplock-Key")
        request = Request(idempotency_key=dedup.idempotency_key(dict(headers.items())),
                          message_id=int(headers["Skiplock-Message-Id"]), attempt=int(headers["Skiplock-Attempt"]),
                          topic=unquote(headers["Skiplock-Topic"]), key=unquote(key_header) if key_header else None,
                          payload=json.loads(body))
        with self.lock:
            self.requests.append(request)
            if request.key is not None:
                n = self.in_flight[request.key] = self.in_flight.get(request.key, 0) + 1
                self.max_in_flight_per_key = max(self.max_in_flight_per_key, n)
        try:
            action = self.script(request) if self.script else Action()
            if 200 <= action.status < 300 and action.apply:
                self.apply(request)
            if action.hold is not None:
                self.held.set()
                action.hold.wait(60)
            if action.hang:
                time.sleep(action.hang)
            return action.status, action.body or ("ok" if action.status < 300 else "scripted failure"), action.headers
        finally:
            if request.key is not None:
                with self.lock:
                    self.in_flight[request.key] -= 1

    def apply(self, request: Request) -> None:
        """The receiver's effect and its idempotency key, in one transaction of its own database."""
        if request.idempotency_key is None:
            raise AssertionError("a delivery came without an Idempotency-Key header")
        with self.pool.connection() as conn, conn.transaction():
            if dedup.once(conn, request.idempotency_key, scope=SCOPE):
                conn.execute("INSERT INTO effects (idempotency_key, message_id, topic, key, payload) "
                             "VALUES (%s, %s, %s, %s, %s)",
                             [request.idempotency_key, request.message_id, request.topic, request.key,
                              json.dumps(request.payload)])

    # ---- assertions ------------------------------------------------------------------------------

    def deliveries(self) -> list[Request]:
        with self.lock:
            return list(self.requests)

    def effects(self) -> list[tuple[str, int, str | None]]:
        """(idempotency_key, message_id, key) of every applied effect, in the order applied."""
        with self.pool.connection() as c:
            return [tuple(r) for r in c.execute("SELECT idempotency_key, message_id, key FROM effects ORDER BY seq")]

    def effect_count(self) -> int:
        with self.pool.connection() as c:
            return c.execute("SELECT count(*) FROM effects").fetchone()[0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.pool.close()
