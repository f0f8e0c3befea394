"""The ``infermux serve`` flags bounding what one HTTP client may hold of a front-end process
(header sizes and count, header and body timeouts, keep-alive, connections), as
:class:`~infermux.settings.HttpLimits`. Their own module so that ``serve_options.py`` stays one
screenful per concern; each default is explained in docs/reliability.md ("HTTP limits")."""

from __future__ import annotations

import argparse

from infermux.cli.option_types import positive
from infermux.settings import HttpLimits

_DEFAULTS = HttpLimits()


def add_http_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the HTTP limit flags, in a group of their own in ``--help``."""
    d = _DEFAULTS
    group = parser.add_argument_group(
        "HTTP limits", "what one HTTP client may hold of each front-end process"
    )
    group.add_argument(
        "--http-max-header-size",
        type=positive(int),
        default=d.max_header_size,
        metavar="BYTES",
        help=f"largest request head, request line and headers together; beyond: 431 "
        f"(default {d.max_header_size})",
    )
    group.add_argument(
        "--http-max-header-line-size",
        type=positive(int),
        default=d.max_header_line_size,
        metavar="BYTES",
        help=f"largest header line (431) or request line (414) (default {d.max_header_line_size})",
    )
    group.add_argument(
        "--http-max-header-count",
        type=positive(int),
        default=d.max_header_count,
        metavar="N",
        help=f"most header fields in a request; beyond: 431 (default {d.max_header_count})",
    )
    group.add_argument(
        "--http-header-timeout",
        type=positive(float),
        default=d.header_timeout,
        metavar="SECONDS",
        help="the whole request head must arrive within this, from the connection (or, between "
        f"requests, its first byte); then 408 and close (default {d.header_timeout:g})",
    )
    group.add_argument(
        "--http-body-timeout",
        type=positive(float),
        default=d.body_timeout,
        metavar="SECONDS",
        help=f"longest pause between two reads of a request body; then 408 and close (default "
        f"{d.body_timeout:g})",
    )
    group.add_argument(
        "--http-keep-alive-timeout",
        type=positive(float),
        default=d.keep_alive_timeout,
        metavar="SECONDS",
        help=f"close a connection idle this long between requests (default "
        f"{d.keep_alive_timeout:g})",
    )
    group.add_argument(
        "--http-max-connections",
        type=positive(int),
        default=d.max_connections,
        metavar="N",
        help=f"open HTTP connections per front-end process; a connection beyond is answered 503 "
        f"and closed (default {d.max_connections})",
    )


def http_limits(args: argparse.Namespace) -> HttpLimits:
    """The limits the parsed flags ask for."""
    return HttpLimits(
        max_header_size=args.http_max_header_size,
        max_header_line_size=args.http_max_header_line_size,
        max_header_count=args.http_max_header_count,
        header_timeout=args.http_header_timeout,
        body_timeout=args.http_body_timeout,
        keep_alive_timeout=args.http_keep_alive_timeout,
        max_connections=args.http_max_connections,
    )
