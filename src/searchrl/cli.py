"""The `searchrl` command. Thin: parse arguments, call one library function per command.

Heavy imports (torch, transformers, faiss) happen inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from searchrl.errors import SearchRLError

app = typer.Typer(
    help="Teach language models to search while they reason (R1-Searcher, outcome-based RL).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(help="Datasets: the toy world, benchmark loaders, the local corpus.", no_args_is_help=True)
index_app = typer.Typer(help="Build and inspect retrieval indexes (BM25, dense FAISS).", no_args_is_help=True)
eval_app = typer.Typer(help="Evaluate models and score prediction files.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.add_typer(index_app, name="index")
app.add_typer(eval_app, name="eval")

err_console = Console(stderr=True)


# Commands are added below, grouped by sub-app. Keep each body to a few lines.


def main() -> None:
    try:
        app()
    except SearchRLError as exc:
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
