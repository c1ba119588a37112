"""``rota``: the friendly command line (Slurm-named commands live beside it)."""
from __future__ import annotations

import sys
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="rota: an event-sourced batch scheduler for shared GPU machines.")


@app.command()
def demo() -> None:
    """Run a short simulated scheduling demo through rota's core (no daemons needed)."""
    from .demo import run_demo

    run_demo(typer.echo)


@app.command()
def version() -> None:
    """Print rota's version."""
    from rota.core import __version__

    typer.echo(f"rota {__version__}")


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
