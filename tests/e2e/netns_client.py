"""The HTTP client tests/e2e/dataplane.py runs inside its network namespace (standard library only).

netns_client.py once URL TIMEOUT
    one GET; prints {"status", "body"} or {"status": 0, "error"} as one JSON line.
netns_client.py loop HOST:PORT CONNECTIONS LABEL STOPFILE PAUSE
    CONNECTIONS threads, each sending GET /req/<id> on a new connection per request (as a client whose
    connections a Service's rules route one by one), PAUSE seconds apart, until STOPFILE exists;
    one JSON line per request:
    {"id", "status", "body" | "error", "started", "ended"} (wall-clock seconds). No retries: a refused or
    reset connection is an outcome, not something to hide.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.client import HTTPConnection
from urllib.parse import urlsplit

_REQUEST_TIMEOUT = 60.0
_lock = threading.Lock()


def _emit(outcome: dict[str, object]) -> None:
    line = json.dumps(outcome)
    with _lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _get(host: str, port: int, path: str, timeout: float) -> dict[str, object]:
    connection = HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        return {"status": response.status, "body": response.read().decode(errors="replace")}
    except OSError as err:
        return {"status": 0, "error": f"{type(err).__name__}: {err}"}
    finally:
        connection.close()


def once(url: str, timeout: float) -> None:
    parts = urlsplit(url)
    _emit(_get(parts.hostname or "", parts.port or 80, parts.path or "/", timeout))


def loop(target: str, connections: int, label: str, stop_file: str, pause: float) -> None:
    host, port = target.rsplit(":", 1)

    def sender(number: int) -> None:
        sent = 0
        while not os.path.exists(stop_file):
            request_id = f"{label}-{number}-{sent}"
            sent += 1
            started = time.time()
            outcome = _get(host, int(port), f"/req/{request_id}", _REQUEST_TIMEOUT)
            _emit({"id": request_id, **outcome, "started": started, "ended": time.time()})
            time.sleep(pause)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    if sys.argv[1] == "once":
        once(sys.argv[2], float(sys.argv[3]))
    else:
        loop(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], float(sys.argv[6]))
