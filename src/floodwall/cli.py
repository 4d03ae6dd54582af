"""The ``floodwall`` command line (typer + rich, from the ``cli`` extra)."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="floodwall",
    help="floodwall: keep partial failures partial.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command()
def demo() -> None:
    """Watch a dependency fail, the breaker open, the fallback answer, and recovery."""
    from floodwall._demo import main

    main()


@app.command("check-config")
def check_config(
    path: str = typer.Argument(..., help="YAML, TOML or JSON configuration file"),
) -> None:
    """Validate a configuration file and print the effective settings per resource."""
    from rich.console import Console
    from rich.table import Table

    from floodwall._core.errors import ConfigError
    from floodwall.config import Registry, load

    console = Console(highlight=False)
    try:
        document = load(path)
        registry = Registry(document)
    except ConfigError as exc:
        Console(stderr=True, highlight=False).print(f"[red]invalid:[/] {exc}")
        raise typer.Exit(code=1) from None
    console.print(f"[green]valid:[/] {path}: {len(document.resources)} resource(s)")
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
def simulate(path: str = typer.Argument(..., help="scenario file (YAML or JSON)")) -> None:
    """Simulate a scenario: goodput, success, shed and latency per phase."""
    from floodwall._core.errors import ConfigError
    from floodwall.sim.cli import simulate as run

    try:
        run(path)
    except ConfigError as exc:
        typer.echo(f"invalid: {exc}", err=True)
        raise typer.Exit(code=1) from None


@app.command()
def gateway(
    config: str = typer.Option(..., "-c", "--config", help="gateway configuration file"),
    workers: int = typer.Option(0, "-w", "--workers", help="worker processes (0: the file's)"),
) -> None:
    """Run the resilient HTTP gateway."""
    from floodwall.gateway.cli import gateway as run

    run(config, workers)


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
