"""A "pod" of the data-plane tests: a real HTTP server on this machine's own address (an EndpointSlice may not name
a loopback one; the data plane's namespace routes to this one), answering who it is and what it was asked.

Each answer is one JSON object: {"pod": its name, "id": the request's id (the path after /req/), "proxied": the
request came through `zeroscale proxy`}. The proxy adds X-Forwarded-For to every request it forwards and a client
of the data plane never sends one, so that header tells a request the proxy carried from one kube-proxy sent
straight here. `seen` records every request that arrived, so a test can count each id once.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.e2e.test_04_proxy_wake import pod_address


class Pod(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.seen: list[dict[str, Any]] = []  # what each answer said, in arrival order
        self.lock = threading.Lock()
        super().__init__((pod_address(), 0), _Handler)
        self._thread = threading.Thread(target=self.serve_forever, daemon=True, name=f"pod {name}")
        self._thread.start()

    def server_bind(self) -> None:  # HTTPServer's would look its own name up in DNS (slow without DNS)
        self.socket.bind(self.server_address)
        self.server_address = self.socket.getsockname()

    @property
    def address(self) -> str:
        return str(self.server_address[0])

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def ready(self) -> bool:
        """Its readiness probe: it answers from the moment it exists (it listens before its constructor returns)."""
        return True

    def stop(self) -> None:
        """Stop listening (a connection not yet accepted is refused); requests being answered still finish."""
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    server: Pod

    def do_GET(self) -> None:
        answer = {
            "pod": self.server.name,
            "id": self.path.removeprefix("/req/"),
            "proxied": self.headers.get("X-Forwarded-For") is not None,
        }
        with self.server.lock:
            self.server.seen.append(answer)
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def answer_of(outcome: dict[str, Any]) -> dict[str, Any]:
    """What the pod said in a client's outcome (netns_client.py), or {} for a failure or someone else's answer."""
    try:
        answer = json.loads(outcome.get("body") or "")
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}
