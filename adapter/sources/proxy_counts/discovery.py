"""Where the replicas are: every address of one or more headless Services' DNS names, or a fixed list.

Several names serve route mode activator: the cluster proxies hold a route's requests while it is cold, and the
sidecars in the app's pods count the ones in flight there (docs/architecture.md#activator); each sits behind a
headless Service of its own. Every address of every name is one replica, the same address under two names once.

Each name's answer replaces that name's replicas alone. "No such name" is an answer: Kubernetes DNS gives NXDOMAIN
for a headless Service with no ready pod (an app scaled to zero has no sidecar left), so that name lists nothing.
Any other failure (a timeout, SERVFAIL) keeps the name's last answer: its replicas may well be there. A name that
has never answered leaves the sum unknown (`unresolved`): it may list replicas nobody else counts.
"""

from __future__ import annotations

import asyncio
import logging
import socket

from adapter.config.base import split_address
from adapter.config.http import HTTPSource

log = logging.getLogger(__name__)

# getaddrinfo's "the name has no address": NXDOMAIN, or a name without A/AAAA records.
_NO_ADDRESS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve(dns: str) -> list[str]:
    """Every address (A and AAAA) the name resolves to, as `ip:port`; raises OSError when the lookup fails."""
    host, port = split_address(dns)
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({_join(str(info[4][0]), port) for info in infos})


def no_address(err: OSError) -> bool:
    """Whether a failed lookup says the name lists no address now (rather than that DNS could not answer)."""
    return isinstance(err, socket.gaierror) and err.errno in _NO_ADDRESS


class Discovery:
    """The replicas every configured name (or the fixed list) lists now."""

    def __init__(self, config: HTTPSource) -> None:
        self._source = config.name
        self.names = config.dns_names()
        self._fixed = list(config.proxies)
        self._answers: dict[str, list[str]] = {}  # each name's last answer
        self._ever_listed: set[str] = set()  # names that listed a replica at least once since start

    @property
    def fixed(self) -> bool:
        return not self.names

    @property
    def unresolved(self) -> list[str]:
        """Names that have never answered: what they list is unknown."""
        return [name for name in self.names if name not in self._answers]

    def addresses(self) -> list[str]:
        """Every replica listed now (sorted, each address once)."""
        if self.fixed:
            return list(self._fixed)
        return sorted({address for answer in self._answers.values() for address in answer})

    def record(self, name: str, answer: list[str] | OSError) -> None:
        """One lookup's outcome for `name`: its replicas, or why there is no answer."""
        if isinstance(answer, list):
            self._answers[name] = answer
            if answer:
                self._ever_listed.add(name)
        elif no_address(answer):
            if self._answers.get(name) != []:
                if name in self._ever_listed:
                    log.info("http source %s: %s lists no replica now (%s)", self._source, name, answer)
                else:  # a name that never existed reads the same as a Service with no pod: say which to check
                    log.warning(
                        "http source %s: %s has listed no replica since start (%s): read as none; if replicas should "
                        "be there (the sidecars of a running app), check the name in the source's dns",
                        self._source,
                        name,
                        answer,
                    )
            self._answers[name] = []
        else:  # keep its replicas; DNS may be back next time
            known = "keeping its last answer" if name in self._answers else "the sum waits for it"
            log.warning("http source %s: cannot resolve %s (%s): %s", self._source, name, known, answer)

    async def refresh(self) -> list[str]:
        """Resolve every name once (all at once) and return the replicas listed now."""
        if not self.fixed:
            answers = await asyncio.gather(*(resolve(name) for name in self.names), return_exceptions=True)
            for name, answer in zip(self.names, answers, strict=True):
                if isinstance(answer, BaseException) and not isinstance(answer, OSError):
                    raise answer
                self.record(name, answer)
        return self.addresses()
