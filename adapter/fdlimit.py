"""The open-files limit, raised once at start by `zeroscale serve` and `zeroscale proxy`.

Every connection holds a descriptor. The soft RLIMIT_NOFILE (often 1,024) is far below what
a server's connection caps allow, and a process that runs out fails every accept and every
outgoing connection at once. The soft limit may be raised up to the hard one without privileges.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def raise_open_files_limit(needed: int, what: str) -> int:
    """Raise the soft limit to the hard one and log the figure; warn when it is below `needed` (`what` names it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # An infinite hard limit is not a value the kernel takes for the soft one (nr_open caps it): ask for enough.
    target = max(soft, needed) if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as err:
            log.warning("cannot raise the open files limit from %d to %d: %s", soft, target, err)
    log.info("open files limit: %d (hard limit %s)", soft, "unlimited" if hard == resource.RLIM_INFINITY else hard)
    if soft < needed:
        log.warning("open files limited to %d: fewer than %s (%d descriptors) can be served", soft, what, needed)
    return soft
