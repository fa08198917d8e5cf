"""The `compactd` console script: `serve` runs the daemon, `proxy` the HTTP proxy, `stats` and
`migrate` read and write the store here, every other command the client CLI.

The one module that sees both sides, so the client (`compactd.clients`) never imports the
daemon, and a client command does not pay for the daemon's imports.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from .clients.cli import parse, reads_only, run

    ns = parse(argv)
    if ns.command == "serve":
        from .daemon.main import serve

        return serve(ns)
    if ns.command == "proxy":
        from .proxy.main import run as proxy

        return proxy(ns)
    if ns.command == "stats":
        from .stats import run as stats

        return stats(ns)
    if ns.command == "migrate":
        from .migrate import run as migrate

        return migrate(ns)
    if reads_only(ns):  # no daemon for a look: the store is read in this process
        from .local import LocalClient

        return run(ns, LocalClient.connect)
    return run(ns)
