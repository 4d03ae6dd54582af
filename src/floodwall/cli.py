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


@app.command()
def version() -> None:
    """Print the installed version."""
    from floodwall import __version__

    typer.echo(__version__)


def main() -> None:
    """Console-script entry point."""
    app()
