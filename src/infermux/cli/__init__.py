"""``infermux`` command line. ``infermux serve`` takes ``tritonserver``'s flag names."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from infermux import __version__
from infermux.bench import options as bench_options
from infermux.cli.process_options import auto_executors
from infermux.cli.serve_options import (
    SERVE_HELP,
    Parser,
    add_serve_arguments,
    build_serve_parser,
    parse_serve,
    parse_settings,
)
from infermux.errors import InfermuxError

__all__ = ["auto_executors", "build_parser", "build_serve_parser", "main", "parse_settings"]


def build_parser() -> argparse.ArgumentParser:
    """The top-level ``infermux`` parser (subcommands: ``serve``, ``bench``)."""
    parser = Parser(prog="infermux", description="A Python-first inference server (KServe V2).")
    parser.add_argument("--version", action="version", version=f"infermux {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    add_serve_arguments(commands.add_parser("serve", help=SERVE_HELP))
    bench_options.build_parser(
        commands.add_parser("bench", help="load-test a model on any KServe V2 server")
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return _bench(argv[1:])
    if not argv or argv[0] != "serve":
        parser = build_parser()
        parser.parse_args(argv)  # handles --help/--version and reports unknown commands
        parser.print_help(sys.stderr)
        return 2
    settings, warnings = parse_serve(argv[1:])
    from infermux.processes.common import configure_logging, run
    from infermux.server import StartupError, serve

    try:
        configure_logging(settings)
    except OSError as exc:
        print(f"infermux: error: --log-file {settings.log_file}: {exc.strerror}", file=sys.stderr)
        return 1
    for warning in warnings:
        logging.getLogger("infermux").warning("%s", warning)
    try:
        run(serve(settings))
    except (StartupError, InfermuxError) as exc:
        print(f"infermux: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # a signal before the handlers were installed
        return 0
    return 0


def _bench(argv: list[str]) -> int:
    from infermux.bench.run import BenchError, run

    options = bench_options.parse_options(argv)
    try:
        run(options)
    except (BenchError, RuntimeError) as exc:
        print(f"infermux bench: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
