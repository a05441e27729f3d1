"""``specstream-mlx``: the command line. Every command parses options and calls the Python API."""

from __future__ import annotations

import sys

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Speculative Streaming for MLX: import, train adapters, generate, export.")


@app.callback()
def _root() -> None:
    """Speculative Streaming for MLX: import, train adapters, generate, export."""


@app.command()
def blas() -> None:
    """Report which BLAS MLX's CPU backend uses in this process (and which would be preloaded)."""
    from mlx_specstream.blas import active_blas, find_blas

    typer.echo(f"active BLAS: {active_blas()}")
    typer.echo(f"optimized BLAS found: {find_blas() or 'none'}")


def main() -> None:
    """Console entry point: optimized BLAS, then the command; known errors as one line."""
    from mlx_specstream.blas import ensure_fast_blas
    from mlx_specstream.errors import USER_ERRORS

    ensure_fast_blas()
    try:
        app()
    except USER_ERRORS as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
