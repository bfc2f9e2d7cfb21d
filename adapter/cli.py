"""The `zeroscale` command: one subcommand per job, each in the module that owns it."""

from __future__ import annotations

import argparse
import asyncio
import importlib
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
        return load_config(args.config, read_files=True)
    except ConfigError as err:
        for problem in err.problems:
            print(f"config error: {problem}", file=sys.stderr)
        raise SystemExit(2) from None


def _traced(config: ZeroscaleConfig, service: str, run: Callable[[], int]) -> int:
    """`run` with tracing on if the config says so, its queued spans flushed when it returns."""
    from adapter.telemetry import tracing

    stop = tracing.start(config.tracing, service)
    try:
        return run()
    finally:
        if stop is not None:
            stop()


def _serve(args: argparse.Namespace) -> int:
    from adapter.serve import run_adapter

    config = _load(args)
    return _traced(config, "zeroscale-adapter", lambda: run_adapter(config, args.ready_file))


def _check(args: argparse.Namespace) -> int:
    from adapter.check import check_sources

    config = _load(args)
    print(f"config ok: {len(config.sources)} source(s), {len(config.metrics)} metric(s)")
    return asyncio.run(check_sources(config))


def _proxy(args: argparse.Namespace) -> int:
    config = _load(args)
    if args.route_for is not None:
        from adapter.proxy import dry_run

        return dry_run.run(config.proxy, args)
    from adapter.proxy_main import run_proxy

    return _traced(config, "zeroscale-proxy", lambda: run_proxy(config.proxy, config.grpc.counts, args.ready_file))


# One row per subcommand, in the order `zeroscale --help` lists them: name, help, and what runs it.
# A function here takes --config (and the options `_OPTIONS` names for it); a module name means that module
# declares its options in `add_arguments(parser)` and does the work in `run(args)`.
SUBCOMMANDS: list[tuple[str, str, Command | str]] = [
    ("serve", "run the external metrics API server (the adapter)", _serve),
    ("check", "validate a config file and try every source once", _check),
    ("proxy", "run the buffering reverse proxy (holds requests while a workload wakes)", _proxy),
    ("explain", "what the HPA (v1.37) would do with these manifests now, and why", "adapter.hpa.explain"),
    ("certs", "make a CA, the adapter's serving certificate and its caBundle", "adapter.certs"),
    ("doctor", "check an installation in a cluster and say what is wrong", "adapter.doctor.run"),
    ("demo", "watch workloads wake from zero and go back, on this machine", "adapter.demo.run"),
]

# Modules declaring more options of a function's subcommand in `add_arguments(parser)`.
_OPTIONS = {"proxy": "adapter.proxy.dry_run"}  # --route-for: which route takes a request, without serving

# The long-running servers: each can say which ports it bound (docs/architecture.md#no-port-races).
_SERVERS = ("serve", "proxy")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zeroscale", description=__doc__)
    parser.add_argument("--version", action="version", version=f"zeroscale {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, help_text, target in SUBCOMMANDS:
        command = commands.add_parser(name, help=help_text)
        if isinstance(target, str):
            module = importlib.import_module(target)
            module.add_arguments(command)
            command.set_defaults(run=module.run)
        else:
            _add_config_option(command)
            if name in _OPTIONS:
                importlib.import_module(_OPTIONS[name]).add_arguments(command)
            command.set_defaults(run=target)
        if name in _SERVERS:
            command.add_argument(
                "--ready-file",
                type=Path,
                default=None,
                help="once every listener is bound, write their addresses here as JSON (name -> host:port); "
                "with port 0 in the config, this is how a starter learns the ports the kernel picked",
            )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run: Command = args.run
    return run(args)
