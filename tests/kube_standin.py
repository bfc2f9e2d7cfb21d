"""A STAND-IN for the Kubernetes API server, for tests only (docs/architecture.md#real-parts: the one allowed fake).

It is not Kubernetes. It answers the few calls Zeroscale makes with the JSON shapes of
docs/protocols.md, on a loopback port, from its own threads, so it works the same for asyncio tests
in-process and for `zeroscale serve` started as a subprocess.

Start and stop::

    with KubeStandIn() as kube:            # HTTPS, certificate from a fresh trustme CA
        config = kube.client_config()      # KubeAPIConfig(url, ca_file, token_file) for KubeClient
        ...

`KubeStandIn(ca=my_trustme_ca, tls=False, token="t")`: `ca` issues its serving certificate,
`tls=False` serves plain HTTP, `token` (default: a random one, written to `token_file`) is
the bearer token every request must carry; a wrong or missing one gets a 401 Status.
`kube.requests` records (method, path, headers) of every request.

Built-in routes:

- `POST /apis/authentication.k8s.io/v1/tokenreviews`: `kube.tokens[token] = {"username": ..,
  "uid": .., "groups": [..], "extra": {..}}` decides; every review received is appended to
  `kube.token_reviews` (the whole request body).
- `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`: `kube.authorize(spec)` returns
  "allow", "deny" or "no-opinion" (default: allow all); every review body is appended to
  `kube.access_reviews`.
- ConfigMaps: `GET/list/watch /api/v1/namespaces/{ns}/configmaps[/{name}]`, served from the
  object store. `kube.set_authentication_configmap(...)` writes `kube-system/
  extension-apiserver-authentication` in the shape of docs/protocols.md#authn-configmap (lists as JSON strings).

The object store, for any collection path (e.g. `/api/v1/namespaces/kube-system/configmaps`):
`put(collection, obj)` adds or replaces by `metadata.name` as an administrator would, without
preconditions (sets `metadata.resourceVersion`; a new object gets `uid` and `creationTimestamp`,
a replaced one keeps them; emits ADDED or MODIFIED), `delete(collection, name)` (emits DELETED),
`get(collection, name)`, `objects(collection)`. `serve_collection(pattern, list_kind)` routes GET
of a collection matching the regular expression `pattern` (list, `?watch=1` with optional
`resourceVersion`, `fieldSelector=metadata.name=X`, `labelSelector=k=v,...`) and GET of one
object under it. A watch without `resourceVersion` first sends ADDED for every current object,
like the real server. `end_watches()` closes every open watch stream (clients must re-list and
re-watch).

`serve_collection(..., writable=True)` also serves writes, with the real API server's semantics
(optimistic concurrency, docs/protocols.md) and its Status bodies:

- `POST` of the collection creates: 201 with the stored object (`resourceVersion`, `uid`,
  `creationTimestamp` set by the server; `generateName` honoured), ADDED to watches; 409
  `AlreadyExists` when the name is taken; 400 `BadRequest` when the body's namespace is not the URL's.
- `PUT` of one object replaces it: 200, MODIFIED to watches; `uid` and `creationTimestamp` are
  kept from the stored object. A `metadata.resourceVersion` in the body must be the stored one
  (else 409 `Conflict`, nothing written); none means an unconditional update. 404 `NotFound` when
  it does not exist (these resources do not create on update); 400 when the body names another
  object. An update that changes nothing is not written: same resourceVersion, no event.
- `DELETE` of one object: 200 with the object, DELETED to watches; 404 `NotFound` when missing.

`kube.writes` records (method, path, body) of every write request that succeeded, in order, and
each callable in `kube.before_write` is called with (method, path, body) before a write is applied
(from the stand-in's thread): a test can look at its own state there, or change the store as a
concurrent writer would.

Add routes of your own with `add_route(method, regex, handler)`: the regex is matched
(fullmatch) against the path without the query, and `handler(request, match)` returns a
`Reply` (status, JSON-able body), a `WatchReply` (stream a store collection's events), or None
to pass the request on to the routes added before it. Later routes win over earlier ones, so a
test can override a built-in (e.g. refuse one client's writes); `add_route` returns a function
that removes the route again.
"""

from __future__ import annotations

import json
import re
import secrets
import ssl
import tempfile
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import trustme

from adapter.config.kube import KubeAPIConfig

AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
CONFIGMAPS = r"/api/v1/namespaces/[^/]+/configmaps"


@dataclass
class StandInRequest:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # names lower-cased
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")

    def param(self, name: str) -> str | None:
        values = self.query.get(name)
        return values[0] if values else None


@dataclass
class Reply:
    status: int = 200
    body: Any = None


@dataclass
class WatchReply:
    collection: str
    resource_version: int | None = None
    accept: Callable[[dict[str, Any]], bool] = field(default=lambda _obj: True)


Handler = Callable[[StandInRequest, "re.Match[str]"], "Reply | WatchReply | None"]


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    """A metav1.Status failure, as the real API server sends with every error."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _resource(collection: str) -> str:
    """`endpointslices.discovery.k8s.io` for a collection path, as the API's messages name a resource."""
    parts = collection.strip("/").split("/")
    plural = parts[-1]
    return plural if parts[0] == "api" else f"{plural}.{parts[1]}"


def _not_found(collection: str, name: str) -> Reply:
    return Reply(404, status_body(404, "NotFound", f'{_resource(collection)} "{name}" not found'))


def _label_filter(selector: str | None, field_selector: str | None) -> Callable[[dict[str, Any]], bool]:
    """Equality-only selectors: all the callers of this stand-in use."""
    wanted_labels = dict(part.split("=", 1) for part in selector.split(",") if part) if selector else {}
    wanted_name = None
    if field_selector:
        key, _, wanted_name = field_selector.partition("=")
        if key != "metadata.name":
            raise ValueError(f"the stand-in only supports fieldSelector=metadata.name=..., not {field_selector}")

    def accept(obj: dict[str, Any]) -> bool:
        metadata = obj.get("metadata", {})
        labels = metadata.get("labels") or {}
        if wanted_name is not None and metadata.get("name") != wanted_name:
            return False
        return all(labels.get(k) == v for k, v in wanted_labels.items())

    return accept


class _Store:
    """Objects per collection path, with one resourceVersion counter and an event log for watches."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.version = 0
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {}
        self.watch_generation = 0  # bumped to end every open watch
        self.stopped = False

    def record(self, collection: str, kind: str, obj: dict[str, Any]) -> None:
        self.events.setdefault(collection, []).append((self.version, kind, obj))
        self.lock.notify_all()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read `requests` instead of stderr noise

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        standin = self.server.standin
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        request = StandInRequest(
            self.command,
            parts.path,
            parse_qs(parts.query),
            {k.lower(): v for k, v in self.headers.items()},
            self.rfile.read(length) if length else b"",
        )
        standin.requests.append((request.method, self.path, request.headers))
        if standin.token is not None and request.headers.get("authorization") != f"Bearer {standin.token}":
            self._reply(Reply(401, status_body(401, "Unauthorized", "Unauthorized")))
            return
        try:
            reply = standin.route(request)
        except Exception as err:  # a broken test handler should show up as a 500, not a hang
            reply = Reply(500, status_body(500, "InternalError", f"stand-in handler failed: {err!r}"))
        if isinstance(reply, WatchReply):
            self._stream(reply)
        else:
            self._reply(reply)

    def _reply(self, reply: Reply) -> None:
        body = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the client went away (it gave up waiting): nothing to answer

    def _stream(self, watch: WatchReply) -> None:
        store = self.server.standin.store
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        # Events are collected under the lock and written outside it: a slow reader blocks only itself.
        with store.lock:
            generation = store.watch_generation
            seen = store.version if watch.resource_version is None else watch.resource_version
            pending = (
                [("ADDED", obj) for obj in store.objects.get(watch.collection, {}).values()]
                if watch.resource_version is None
                else []
            )
        try:
            while True:
                for kind, obj in pending:
                    self._chunk({"type": kind, "object": obj}, watch)
                with store.lock:
                    if not any(version > seen for version, _, _ in store.events.get(watch.collection, [])):
                        store.lock.wait(0.5)
                    if store.stopped or store.watch_generation != generation:
                        break
                    pending = [(k, o) for v, k, o in store.events.get(watch.collection, []) if v > seen]
                    seen = store.version
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            pass  # the client went away

    def _chunk(self, event: dict[str, Any], watch: WatchReply) -> None:
        if not watch.accept(event["object"]):
            return
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    standin: KubeStandIn


class KubeStandIn:
    """A stand-in for the Kubernetes API on 127.0.0.1 (see the module docstring)."""

    def __init__(self, ca: trustme.CA | None = None, *, tls: bool = True, token: str | None = "random") -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="kube-standin-")
        self.directory = Path(self._dir.name)
        self.ca = ca or trustme.CA()
        self.tls = tls
        self.token = secrets.token_urlsafe(16) if token == "random" else token
        self.token_file = self.directory / "token"
        self.token_file.write_text(self.token or "")
        self.ca_file = self.directory / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.tokens: dict[str, dict[str, Any]] = {}
        self.token_reviews: list[dict[str, Any]] = []
        self.access_reviews: list[dict[str, Any]] = []
        self.authorize: Callable[[dict[str, Any]], str] = lambda _spec: "allow"
        self.store = _Store()
        self.writes: list[tuple[str, str, Any]] = []
        self.before_write: list[Callable[[str, str, Any], None]] = []
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self.add_route("POST", r"/apis/authentication\.k8s\.io/v1/tokenreviews", self._token_review)
        self.add_route("POST", r"/apis/authorization\.k8s\.io/v1/subjectaccessreviews", self._access_review)
        self.serve_collection(CONFIGMAPS, "ConfigMapList")

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> KubeStandIn:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.standin = self
        if self.tls:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
            # Handshake in the connection's thread, not in the accept loop.
            server.socket = context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name="kube-standin", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.store.lock:
            self.store.stopped = True
            self.store.lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._dir.cleanup()

    def __enter__(self) -> KubeStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the stand-in first"
        port: int = self._server.server_address[1]
        return port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def client_config(self, **overrides: Any) -> KubeAPIConfig:
        """Settings that make a KubeClient talk to this stand-in."""
        settings: dict[str, Any] = {
            "url": self.url,
            "ca_file": self.ca_file if self.tls else None,
            "token_file": self.token_file if self.token else None,
            "timeout": 5.0,
        }
        settings.update(overrides)
        return KubeAPIConfig(**settings)

    # -- routing -------------------------------------------------------------------------

    def add_route(self, method: str, pattern: str, handler: Handler) -> Callable[[], None]:
        entry = (method.upper(), re.compile(pattern), handler)
        self._routes.append(entry)
        return lambda: self._routes.remove(entry)

    def route(self, request: StandInRequest) -> Reply | WatchReply:
        for method, pattern, handler in reversed(list(self._routes)):
            match = pattern.fullmatch(request.path)
            if match is not None and method == request.method:
                reply = handler(request, match)
                if reply is not None:
                    return reply
        return Reply(
            404, status_body(404, "NotFound", f"the server could not find the requested resource {request.path}")
        )

    # -- object store --------------------------------------------------------------------

    def put(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Add or replace an object (by metadata.name); returns the stored copy with its resourceVersion."""
        with self.store.lock:
            return self._store(collection, obj)

    def _store(self, collection: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Write under the store's lock: what every write path of the real server ends in."""
        store = self.store
        existing = store.objects.setdefault(collection, {})
        stored: dict[str, Any] = json.loads(json.dumps(obj))
        metadata = stored.setdefault("metadata", {})
        previous = existing.get(metadata["name"])
        if previous is None:
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        else:  # system fields survive a replace, whatever the body said
            for key in ("uid", "creationTimestamp"):
                metadata[key] = previous["metadata"][key]
        store.version += 1
        metadata["resourceVersion"] = str(store.version)
        existing[metadata["name"]] = stored
        store.record(collection, "ADDED" if previous is None else "MODIFIED", stored)
        return stored

    def delete(self, collection: str, name: str) -> None:
        with self.store.lock:
            obj = self.store.objects.get(collection, {}).pop(name)
            self.store.version += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.store.version)}}
            self.store.record(collection, "DELETED", obj)

    def get(self, collection: str, name: str) -> dict[str, Any] | None:
        with self.store.lock:
            return self.store.objects.get(collection, {}).get(name)

    def objects(self, collection: str) -> list[dict[str, Any]]:
        with self.store.lock:
            return list(self.store.objects.get(collection, {}).values())

    def end_watches(self) -> None:
        with self.store.lock:
            self.store.watch_generation += 1
            self.store.lock.notify_all()

    def serve_collection(self, pattern: str, list_kind: str, *, writable: bool = False) -> None:
        """Route list / watch of collections matching `pattern`, and GET of one object under them; with
        `writable`, POST, PUT and DELETE too (see the module docstring)."""

        def collection(request: StandInRequest, match: re.Match[str]) -> Reply | WatchReply:
            try:
                accept = _label_filter(request.param("labelSelector"), request.param("fieldSelector"))
            except ValueError as err:
                return Reply(400, status_body(400, "BadRequest", str(err)))
            if request.param("watch") in ("1", "true"):
                version = request.param("resourceVersion")
                return WatchReply(request.path, int(version) if version else None, accept)
            with self.store.lock:
                items = [obj for obj in self.objects(request.path) if accept(obj)]
                version = str(self.store.version)
            return Reply(
                200,
                {"kind": list_kind, "apiVersion": "v1", "metadata": {"resourceVersion": version}, "items": items},
            )

        def single(request: StandInRequest, match: re.Match[str]) -> Reply:
            obj = self.get(match.group("collection"), match.group("name"))
            return _not_found(match.group("collection"), match.group("name")) if obj is None else Reply(200, obj)

        self.add_route("GET", pattern, collection)
        self.add_route("GET", f"(?P<collection>{pattern})/(?P<name>[^/]+)", single)
        if writable:
            self.add_route("POST", pattern, self._create)
            self.add_route("PUT", f"(?P<collection>{pattern})/(?P<name>[^/]+)", self._update)
            self.add_route("DELETE", f"(?P<collection>{pattern})/(?P<name>[^/]+)", self._delete)

    def _write_body(self, request: StandInRequest, collection: str) -> dict[str, Any] | Reply:
        """The request's object, or the 400 the real server answers for one it cannot take."""
        try:
            obj = request.json()
        except ValueError as err:
            return Reply(400, status_body(400, "BadRequest", f"the body is not JSON: {err}"))
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            return Reply(400, status_body(400, "BadRequest", "the body is not an object with metadata"))
        namespace = re.search(r"/namespaces/([^/]+)/", collection)
        given = obj.get("metadata", {}).get("namespace")
        if namespace is not None and given not in (None, "", namespace.group(1)):
            message = "the namespace of the provided object does not match the namespace sent on the request"
            return Reply(400, status_body(400, "BadRequest", message))
        return obj

    def _create(self, request: StandInRequest, _match: re.Match[str]) -> Reply:
        collection = request.path
        obj = self._write_body(request, collection)
        if isinstance(obj, Reply):
            return obj
        metadata = obj.setdefault("metadata", {})
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        name = metadata.get("name")
        if not isinstance(name, str) or not name:
            return Reply(400, status_body(400, "BadRequest", "name or generateName is required"))
        self._before_write(request)
        with self.store.lock:
            if name in self.store.objects.get(collection, {}):
                message = f'{_resource(collection)} "{name}" already exists'
                return Reply(409, status_body(409, "AlreadyExists", message))
            for key in ("uid", "creationTimestamp", "resourceVersion"):
                metadata.pop(key, None)  # the server's to set
            stored = self._store(collection, obj)
        self.writes.append((request.method, request.path, obj))
        return Reply(201, stored)

    def _update(self, request: StandInRequest, match: re.Match[str]) -> Reply:
        collection, name = match.group("collection"), match.group("name")
        obj = self._write_body(request, collection)
        if isinstance(obj, Reply):
            return obj
        metadata = obj.setdefault("metadata", {})
        if metadata.get("name") != name:
            message = f"the name of the object ({metadata.get('name')}) does not match the name on the URL ({name})"
            return Reply(400, status_body(400, "BadRequest", message))
        self._before_write(request)
        with self.store.lock:
            current = self.store.objects.get(collection, {}).get(name)
            if current is None:
                return _not_found(collection, name)
            wanted = metadata.get("resourceVersion")
            if wanted and wanted != current["metadata"]["resourceVersion"]:
                message = (
                    f'Operation cannot be fulfilled on {_resource(collection)} "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again"
                )
                return Reply(409, status_body(409, "Conflict", message))
            system = {key: current["metadata"][key] for key in ("uid", "creationTimestamp", "resourceVersion")}
            # A no-op update is not written: no new resourceVersion, no event.
            unchanged = {**obj, "metadata": {**metadata, **system}} == current
            stored = current if unchanged else self._store(collection, obj)
        self.writes.append((request.method, request.path, obj))
        return Reply(200, stored)

    def _delete(self, request: StandInRequest, match: re.Match[str]) -> Reply:
        collection, name = match.group("collection"), match.group("name")
        self._before_write(request)
        with self.store.lock:
            current = self.store.objects.get(collection, {}).get(name)
            if current is None:
                return _not_found(collection, name)
            self.delete(collection, name)
        self.writes.append((request.method, request.path, None))
        return Reply(200, current)

    def _before_write(self, request: StandInRequest) -> None:
        body = request.json() if request.body else None
        for hook in list(self.before_write):
            hook(request.method, request.path, body)

    # -- authentication ConfigMap --------------------------------------------------------

    def set_authentication_configmap(
        self,
        requestheader_ca_pem: bytes,
        allowed_names: list[str],
        client_ca_pem: bytes | None = None,
    ) -> dict[str, Any]:
        """Write kube-system/extension-apiserver-authentication as the kube-apiserver does
        (docs/protocols.md#authn-configmap)."""
        namespace, name = AUTH_CONFIGMAP
        data = {
            "requestheader-client-ca-file": requestheader_ca_pem.decode(),
            "requestheader-allowed-names": json.dumps(allowed_names),
            "requestheader-username-headers": json.dumps(["X-Remote-User"]),
            "requestheader-group-headers": json.dumps(["X-Remote-Group"]),
            "requestheader-extra-headers-prefix": json.dumps(["X-Remote-Extra-"]),
            "requestheader-uid-headers": json.dumps(["X-Remote-Uid"]),
        }
        if client_ca_pem is not None:
            data["client-ca-file"] = client_ca_pem.decode()
        configmap = {
            "kind": "ConfigMap",
            "apiVersion": "v1",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        }
        return self.put(f"/api/v1/namespaces/{namespace}/configmaps", configmap)

    # -- TokenReview and SubjectAccessReview ---------------------------------------------

    def _token_review(self, request: StandInRequest, _match: re.Match[str]) -> Reply:
        review = request.json()
        self.token_reviews.append(review)
        user = self.tokens.get(review.get("spec", {}).get("token", ""))
        status: dict[str, Any] = (
            {"authenticated": True, "user": user, "audiences": review["spec"].get("audiences") or []}
            if user is not None
            else {"authenticated": False, "user": {}, "error": "invalid bearer token"}
        )
        return Reply(201, {**review, "metadata": {"creationTimestamp": None}, "status": status})

    def _access_review(self, request: StandInRequest, _match: re.Match[str]) -> Reply:
        review = request.json()
        self.access_reviews.append(review)
        decision = self.authorize(review.get("spec", {}))
        status = {"allowed": decision == "allow"}
        if decision == "deny":
            status["denied"] = True
        return Reply(201, {**review, "metadata": {"creationTimestamp": None}, "status": status})
