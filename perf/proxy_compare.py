"""The HTTP/1.1 warm path of this checkout against another checkout of Zeroscale, in one run.

(a) of proxy_bench.py with two proxies: the other checkout's (`python perf/proxy_compare.py PATH`, e.g. a
`git worktree add --detach /tmp/before <commit>`) and this one's, beside nginx `proxy_pass` and the upstream directly,
interleaved for ROUNDS rounds, so a change to the hot path is judged against its own baseline on the same noisy
machine. Both run from this checkout's virtualenv (the other one's code first on PYTHONPATH). Last lines:
`before: ratio_vs_nginx=<x> added_p50_us=<y> ...` and `after: ...`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import proxy_bench as bench  # this directory, on sys.path above


def main(before: Path) -> None:
    if not (before / "adapter" / "proxy").is_dir():
        raise SystemExit(f"{before} is not a checkout of Zeroscale (no adapter/proxy)")
    with (
        bench.nginx(bench.UPSTREAM) as up,
        bench.nginx(bench.nginx_proxy(up)) as via_nginx,
        bench.zeroscale_proxy(up, PYTHONPATH=str(before)) as (old, _, _),
        bench.zeroscale_proxy(up) as (new, _, _),
    ):
        targets = {"direct": up, "nginx": via_nginx, "before": old, "after": new}
        median = bench.interleaved(targets, bench.wrk, bench.CONNECTIONS, "c")
    for label in ("before", "after"):
        ratio = median[(label, 64)][0] / median[("nginx", 64)][0]
        added = median[(label, 1)][1] - median[("direct", 1)][1]
        print(f"{label}: ratio_vs_nginx={ratio:.2f} added_p50_us={added:.0f} req_s_at_64={median[(label, 64)][0]:.0f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python perf/proxy_compare.py PATH-OF-THE-OTHER-CHECKOUT")
    main(Path(sys.argv[1]).resolve())
