"""A stand-in for kube-proxy (the plane has none): one Service port on loopback, forwarding each new connection
to the endpoint that is ready now.

What a rollout needs from kube-proxy, and no more: `route_to` switches new connections to another endpoint
(the new pod became Ready, the old one is terminating); connections already open keep going to the endpoint
they were made to until it closes them, as conntrack keeps them.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class ServiceProxy:
    def __init__(self, port: int, target: int) -> None:
        self._target = target
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]  # port 0: the kernel's pick
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name=f"service-proxy-{self.port}", daemon=True).start()

    def route_to(self, target: int) -> None:
        self._target = target

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client, self._target), daemon=True).start()

    @staticmethod
    def _connect(client: socket.socket, target: int) -> None:
        try:
            upstream = socket.create_connection(("127.0.0.1", target), timeout=5)
        except OSError:
            client.close()  # no endpoint: the caller sees a refused connection, as with kube-proxy's REJECT
            return
        upstream.settimeout(None)
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=ServiceProxy._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
