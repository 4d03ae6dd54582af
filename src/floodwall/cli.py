"""The ``floodwall`` command line (typer + rich, from the ``cli`` extra).

Exit status, the same for every subcommand (and shown by ``--help``): 0 when it did what was
asked; 1 when a check failed (``check-config`` found the document invalid, a drill missed its
``expect`` section) or a running command failed (the gateway cannot bind); 2 for a usage error
or invalid input (an unknown option, a file that cannot be read, an invalid configuration or
scenario given to ``gateway``, ``drill`` or ``simulate``). Shell completion comes from typer
(``--install-completion``, ``--show-completion``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from floodwall.config import Document, Registry

OK, FAILED, INVALID = 0, 1, 2
"""Exit statuses: success; a check failed; usage error or invalid input."""

EXIT_CODES = (
    "Exit status: 0 ok; 1 a check failed (check-config found the document invalid, a drill "
    "missed its expectations) or a running command failed; 2 usage error or invalid input "
    "(unreadable file, invalid configuration or scenario)."
)

app = typer.Typer(
    name="floodwall",
    help=f"floodwall: keep partial failures partial.\n\n{EXIT_CODES}",
    no_args_is_help=True,
)


_SCENARIO = typer.Argument(
    exists=True, dir_okay=False, readable=True, help="Scenario file (YAML or JSON)."
)
"""A scenario file argument: a missing or unreadable one is a usage error (status 2)."""


def _show_version(value: bool) -> None:
    if value:
        from floodwall import __version__

        typer.echo(f"floodwall {__version__}")
        raise typer.Exit(OK)


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        callback=_show_version,
        is_eager=True,
        help="Print the installed version and exit.",
    ),
) -> None:
    """floodwall: keep partial failures partial."""


@app.command()
def demo(
    json_out: str | None = typer.Option(
        None, "--json", metavar="PATH", help="Also write every figure of the table as JSON."
    ),
    html_out: str | None = typer.Option(
        None, "--html", metavar="PATH", help="Write the HTML report here (default: a temp dir)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Shorter phases: ~20 s instead of ~1 min."),
) -> None:
    """The seeds' two outages, unprotected and protected, side by side (about a minute)."""
    from floodwall.drill.cli import demo as run

    run(json_out, html_out, quick)


@app.command()
def drill(
    path: Annotated[Path, _SCENARIO],
    json_out: str | None = typer.Option(
        None, "--json", metavar="PATH", help="Write every figure as JSON."
    ),
    html_out: str | None = typer.Option(
        None, "--html", metavar="PATH", help="Write the HTML report here (default: a temp dir)."
    ),
) -> None:
    """Run a chaos drill: detection, blast radius, recovery, data consistency, amplification."""
    from floodwall._core.errors import ConfigError
    from floodwall.drill.cli import drill as run

    try:
        run(str(path), json_out, html_out)
    except ConfigError as exc:
        typer.echo(f"invalid: {exc}", err=True)
        raise typer.Exit(code=INVALID) from None


@app.command("check-config")
def check_config(
    path: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            readable=True,
            help="YAML, TOML or JSON file: a library configuration or a gateway file.",
        ),
    ],
    gateway: bool = typer.Option(
        False, "--gateway", help="Check it as a gateway file (default: told by its sections)."
    ),
) -> None:
    """Validate a configuration and print the effective settings per resource.

    A file with a gateway section (listen, upstreams, routes, admin, ...) is checked as a gateway
    file, any other as a library configuration. An empty document, a library file that names no
    resource and a gateway file that names no route fail the check.
    """
    from rich.console import Console
    from rich.markup import escape

    from floodwall._core.errors import ConfigError

    console = Console(highlight=False)
    try:
        _check(console, path, gateway)
    except ConfigError as exc:
        Console(stderr=True, highlight=False).print(f"[red]invalid:[/] {escape(str(exc))}")
        raise typer.Exit(code=FAILED) from None


def _check(console: Console, path: Path, as_gateway: bool) -> None:
    from floodwall._core.errors import ConfigError
    from floodwall.config import loads, parse
    from floodwall.gateway.cli import is_gateway_document

    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    raw = loads(text, source)
    if not raw:
        raise ConfigError(f"{source}: the document is empty: it configures nothing")
    resources = raw.get("resources", {})
    if not isinstance(resources, Mapping):
        raise ConfigError(
            f"{source}: resources: must be a mapping of resource names to their policies, "
            f"got {resources!r}"
        )
    if as_gateway or is_gateway_document(raw):
        _check_gateway(console, raw, source)
        return
    document = parse(raw, source)
    if not document.resources:
        raise ConfigError(f"{source}: resources: no resource is configured")
    registry = _built(document, source)
    try:
        console.print(f"[green]valid:[/] {source}: {len(document.resources)} resource(s)")
        _print_resources(console, document, registry)
    finally:
        registry.close()


def _built(document: Document, source: str) -> Registry:
    """The registry of ``document``, built as a service would build it: an error found only
    then (a store that cannot be opened, a section that fails) names the file and its path."""
    from floodwall._core.errors import ConfigError
    from floodwall.config import Registry

    try:
        return Registry(document)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _check_gateway(console: Console, raw: dict[str, Any], source: str) -> None:
    from floodwall._core.clock import SYSTEM_CLOCK
    from floodwall._core.errors import ConfigError
    from floodwall.gateway.config import parse_gateway
    from floodwall.gateway.policies import check_limits

    document = parse_gateway(raw, source)
    if not document.routes:
        raise ConfigError(f"{source}: routes: no route is configured")
    try:
        check_limits(document, SYSTEM_CLOCK)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    registry = _built(document, source) if document.resources else None
    routes, upstreams = len(document.routes), len(document.upstreams)
    host, port = document.listen
    console.print(
        f"[green]valid:[/] {source}: gateway on {host}:{port}, {routes} route(s), "
        f"{upstreams} upstream(s), {len(document.resources)} resource(s)"
    )
    for name, upstream in document.upstreams.items():
        console.print(f"upstream {name}: {', '.join(str(e) for e in upstream.endpoints)}")
    for label in document.route_names():
        console.print(f"route {label}")
    if registry is not None:
        try:
            _print_resources(console, document, registry)
        finally:
            registry.close()


def _print_resources(console: Console, document: Document, registry: Registry) -> None:
    from rich.table import Table

    for name, config in document.resources.items():
        table = Table(title=f"{name} (level {config.level})", title_justify="left")
        table.add_column("policy")
        table.add_column("effective settings")
        for section, value in config.model_dump(mode="json", exclude={"level"}).items():
            if value is not None:
                table.add_row(section, ", ".join(_flatten(value)))
        console.print(table)
        console.print(f"pipeline: {registry.get(name).pipeline}\n")
    for store, url in document.stores.items():
        console.print(f"store {store}: {url}")


@app.command()
def simulate(path: Annotated[Path, _SCENARIO]) -> None:
    """Simulate a scenario: goodput, success, shed and latency per phase."""
    from floodwall._core.errors import ConfigError
    from floodwall.sim.cli import simulate as run

    try:
        run(str(path))
    except ConfigError as exc:
        typer.echo(f"invalid: {exc}", err=True)
        raise typer.Exit(code=INVALID) from None


@app.command()
def gateway(
    config: str = typer.Option(..., "-c", "--config", help="gateway configuration file"),
    workers: int = typer.Option(0, "-w", "--workers", help="worker processes (0: the file's)"),
) -> None:
    """Run the resilient HTTP gateway."""
    from floodwall.gateway.cli import gateway as run

    run(config, workers)


host_app = typer.Typer(
    name="host",
    help="The host:// stores of this user: show or remove one NAME's semaphores and memory.",
    no_args_is_help=True,
)
app.add_typer(host_app)


@host_app.command("info")
def host_info(name: Annotated[str, typer.Argument(help="The NAME of host://NAME.")]) -> None:
    """Show NAME's System V keys (as ipcs shows them), its users and its host bulkheads."""
    from floodwall._core.errors import ConfigError
    from floodwall.stores.host import info

    try:
        found = info(name)
    except (ConfigError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(INVALID) from None
    typer.echo(f"host://{found.name}")
    typer.echo(f"  semaphores    key {found.semaphore_key:#010x}  exists: {found.semaphores}")
    typer.echo(
        f"  shared memory key {found.shared_memory_key:#010x}  exists: {found.shared_memory}"
    )
    typer.echo(f"  processes using it: {found.users}")
    for bulkhead, size, free in found.bulkheads:
        typer.echo(f"  bulkhead {bulkhead!r}: {size - free}/{size} in flight")


@host_app.command("remove")
def host_remove(
    name: Annotated[str, typer.Argument(help="The NAME of host://NAME.")],
    force: Annotated[
        bool, typer.Option("--force", help="Remove even while processes use it.")
    ] = False,
) -> None:
    """Remove NAME's semaphore set and shared memory (left by a killed last process).

    Refused (status 1) while a process uses NAME, unless --force: their calls then fail as a
    store outage and each process's on_store_error decides.
    """
    from floodwall._core.errors import ConfigError
    from floodwall.stores.host import keys_of, remove

    try:
        keys_of(name)
    except ConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(INVALID) from None
    try:
        removed = remove(name, force=force)
    except ConfigError as exc:
        typer.echo(f"refused: {exc}", err=True)
        raise typer.Exit(FAILED) from None
    except OSError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(FAILED) from None
    typer.echo(f"host://{name}: {'removed' if removed else 'nothing to remove'}")


@app.command()
def version() -> None:
    """Print the installed version."""
    from floodwall import __version__

    typer.echo(__version__)


def _flatten(values: dict[str, object], prefix: str = "") -> list[str]:
    """``{"backoff": {"kind": "full"}} -> ["backoff.kind=full"]``, leaving out unset keys."""
    items: list[str] = []
    for key, value in values.items():
        if isinstance(value, dict):
            items.extend(_flatten(value, f"{prefix}{key}."))
        elif value is not None:
            items.append(f"{prefix}{key}={value}")
    return items


def main() -> None:
    """Console-script entry point."""
    app()
