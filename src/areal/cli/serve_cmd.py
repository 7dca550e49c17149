"""``areal serve``: start one process of a run on its own (here: an inference server)."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    help="Start one areal server on its own, e.g. to point agents running elsewhere at it.\n\n"
    "Example: [bold]areal serve inference --model ./tiny --port 30000[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@app.command("inference")
def inference_command(
    model: Path = typer.Option(..., "--model", help="Hugging Face style checkpoint directory."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(30000, "--port", help="Port to listen on."),
    max_total_tokens: int | None = typer.Option(
        None, "--max-total-tokens", help="KV-cache capacity in tokens (default: from memory)."
    ),
    mem_fraction_static: float | None = typer.Option(
        None, "--mem-fraction-static", help="Fraction of memory for weights and KV cache."
    ),
    max_running_requests: int = typer.Option(
        64, "--max-running-requests", help="Most requests decoded at once."
    ),
    weight_version: str | None = typer.Option(
        None, "--weight-version", help="Version reported for the loaded weights."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="Model name reported by /model_info (default: path)."
    ),
) -> None:
    """Serve a checkpoint with the embedded torch engine over the SGLang native HTTP API.

    Example: [bold]areal serve inference --model ./tiny --max-running-requests 16[/bold]
    """
    from areal.plugins.inference.embedded.server import serve

    serve(
        model_path=str(model),
        host=host,
        port=port,
        max_total_tokens=max_total_tokens,
        mem_fraction_static=mem_fraction_static,
        max_running_requests=max_running_requests,
        weight_version=weight_version,
        seed=seed,
        log_level=log_level,
        served_model_name=served_model_name,
    )
