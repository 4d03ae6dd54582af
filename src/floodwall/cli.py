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
    path: str = typer.Argument(..., help="Scenario file (YAML or JSON)."),
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
        run(path, json_out, html_out)
    except ConfigError as exc:
        typer.echo(f"invalid: {exc}", err=True)
        raise typer.Exit(code=1) from None


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
