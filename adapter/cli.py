"""The `zeroscale` command: one subcommand per job, each in the module that owns it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from adapter import __version__
from adapter.config import CONFIG_ENV, ConfigError, ZeroscaleConfig, load_config

Command = Callable[[argparse.Namespace], int]


def _add_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", "-c", type=Path, default=None, help=f"YAML config file (default: ${CONFIG_ENV})")


def _load(args: argparse.Namespace) -> ZeroscaleConfig:
    try:
        return load_config(args.config)
    except ConfigError as err:
        for problem in err.problems:
            print(f"config error: {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def _serve(args: argparse.Namespace) -> int:
    from adapter.api.run import run_adapter

    return run_adapter(_load(args))


def _check(args: argparse.Namespace) -> int:
    from adapter.check import check_sources

    config = _load(args)
    print(f"config ok: {len(config.sources)} source(s), {len(config.metrics)} metric(s)")
    return asyncio.run(check_sources(config))


def _proxy(args: argparse.Namespace) -> int:
    from adapter.proxy.server import run_proxy

    config = _load(args)
    return run_proxy(config.proxy, config.grpc.counts)


def _explain(args: argparse.Namespace) -> int:
    from adapter.hpa.explain import run

    return run(args)


def _certs(args: argparse.Namespace) -> int:
    from adapter.certs import run

    return run(args)


def _doctor(args: argparse.Namespace) -> int:
    from adapter.doctor.run import run

    return run(args)


def _demo(args: argparse.Namespace) -> int:
    from adapter.demo.run import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroscale", description=__doc__)
    parser.add_argument("--version", action="version", version=f"zeroscale {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the external metrics API server (the adapter)")
    _add_config_option(serve)
    serve.set_defaults(run=_serve)

    check = commands.add_parser("check", help="validate a config file and try every source once")
    _add_config_option(check)
    check.set_defaults(run=_check)

    proxy = commands.add_parser("proxy", help="run the buffering reverse proxy (holds requests while a workload wakes)")
    _add_config_option(proxy)
    proxy.set_defaults(run=_proxy)

    from adapter.hpa.explain import add_arguments as add_explain_arguments

    explain = commands.add_parser("explain", help="what the HPA (v1.37) would do with these manifests now, and why")
    add_explain_arguments(explain)
    explain.set_defaults(run=_explain)

    from adapter.certs import add_arguments as add_certs_arguments

    certs = commands.add_parser("certs", help="make a CA, the adapter's serving certificate and its caBundle")
    add_certs_arguments(certs)
    certs.set_defaults(run=_certs)

    from adapter.doctor.run import add_arguments as add_doctor_arguments

    doctor = commands.add_parser("doctor", help="check an installation in a cluster and say what is wrong")
    add_doctor_arguments(doctor)
    doctor.set_defaults(run=_doctor)

    from adapter.demo.run import add_arguments as add_demo_arguments

    demo = commands.add_parser("demo", help="watch workloads wake from zero and go back, on this machine")
    add_demo_arguments(demo)
    demo.set_defaults(run=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run: Command = args.run
    return run(args)
