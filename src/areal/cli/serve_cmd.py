"""``areal serve``: start one process of a run on its own (an inference server, the gateway)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from areal.gateway.training_flags import DEFAULTS, FLAGS, HELP, TrainingFlags

if TYPE_CHECKING:
    from areal.run.engine_attach import GatewayAttachment

DRAIN_MAX_S = 600.0  # the most the gateway lets a detach drain

app = typer.Typer(
    help="Start one areal server on its own, e.g. to point agents running elsewhere at it.\n\n"
    "Example: [bold]areal serve inference --model ./tiny --port 30000[/bold]",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


@app.command("inference")
def inference_command(
    model: str = typer.Option(
        ..., "--model", help="Checkpoint directory or Hugging Face Hub id (org/name[@revision])."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind (loopback unless --allow-remote)."
    ),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Let --host be an address other machines can reach."
    ),
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
    incremental_streaming_output: bool = typer.Option(
        True,
        "--incremental-streaming-output/--cumulative-streaming-output",
        help="Streamed /generate chunks carry only the new ids, log-probs and text (O(n) bytes "
        "per stream); --cumulative-streaming-output sends the whole output so far in every "
        "chunk, as SGLang does without its --incremental-streaming-output.",
    ),
    compile_decode: bool = typer.Option(
        False,
        "--compile-decode",
        help="Compile the decode step with torch.compile (inductor): faster steps at every "
        "batch size, after a compile of tens of seconds at start (cached on disk for the next).",
    ),
    pack_weights: bool | None = typer.Option(
        None,
        "--pack-weights/--no-pack-weights",
        help="Run linear layers on oneDNN-packed copies of their weights, re-packed after every "
        "weight update (a second copy of the linear weights in memory), or on torch's own "
        "linear. Default: whichever this CPU runs a decode step's layers faster, measured at "
        "start-up (/server_info says which, as linear_weights).",
        show_default=False,
    ),
    decode_kernel: bool | None = typer.Option(
        None,
        "--decode-kernel/--no-decode-kernel",
        help="Attend in decode steps with areal's C++ kernel (built once per machine with the "
        "C++ compiler, ~6 s; float32 models) or with ATen's gather and SDPA. Default: the "
        "kernel when it builds, else ATen (/server_info says which, as decode_attention); "
        "--decode-kernel makes an unavailable kernel an error.",
        show_default=False,
    ),
    attach: str | None = typer.Option(
        None,
        "--attach",
        metavar="GATEWAY_URL",
        help="Once healthy, join the gateway (or run) at this URL as one of its policy engines "
        "(admin token from $AREAL_ADMIN_TOKEN); on SIGTERM/SIGINT leave it, draining, then stop.",
    ),
    advertise_url: str | None = typer.Option(
        None,
        "--advertise-url",
        help="With --attach: the URL the gateway reaches this engine at (default: "
        "http://HOST:PORT; set it when --host is 0.0.0.0).",
    ),
    drain_timeout: float = typer.Option(
        30.0, "--drain-timeout", help="With --attach: seconds running calls may take to finish."
    ),
) -> None:
    """Serve a checkpoint with the embedded torch engine over the SGLang native HTTP API.

    Example: [bold]areal serve inference --model ./tiny --max-running-requests 16[/bold]

    Add an engine to a running run: [bold]AREAL_ADMIN_TOKEN=... areal serve inference
    --model ./tiny --port 30001 --attach http://127.0.0.1:9000[/bold]
    """
    _check_host(host, allow_remote, "inference engine")
    hooks = _attachment(attach, advertise_url, drain_timeout) if attach else None
    model_path = _local_model(model, "--model")
    from areal.plugins.inference.embedded.server import serve

    serve(
        model_path=model_path,
        host=host,
        port=port,
        max_total_tokens=max_total_tokens,
        mem_fraction_static=mem_fraction_static,
        max_running_requests=max_running_requests,
        weight_version=weight_version,
        seed=seed,
        log_level=log_level,
        served_model_name=served_model_name,
        hooks=hooks,
        incremental_streaming_output=incremental_streaming_output,
        compile_decode=compile_decode,
        pack_weights=pack_weights,
        decode_kernel=decode_kernel,
    )
    if hooks is not None:
        raise typer.Exit(hooks.finish())


def _check_host(host: str, allow_remote: bool, server: str) -> None:
    """Loopback only, unless --allow-remote: one line otherwise, before anything starts."""
    from areal.cli.errors import CLIError
    from areal.host.bind import remote_bind_refusal

    refusal = remote_bind_refusal(host, allow_remote, server)
    if refusal:
        raise CLIError(refusal)


def _attachment(
    gateway_url: str, advertise_url: str | None, drain_timeout: float
) -> GatewayAttachment:
    """The hooks that attach the engine to ``gateway_url``; checked before anything starts."""
    import os

    from areal.run.engine_attach import ADMIN_TOKEN_ENV, GatewayAttachment

    token = os.environ.get(ADMIN_TOKEN_ENV)
    if not token:
        typer.echo(
            f"error: --attach needs the gateway's admin token in ${ADMIN_TOKEN_ENV} "
            "(the token the gateway was started with); it is not set",
            err=True,
        )
        raise typer.Exit(2)
    if not gateway_url.startswith(("http://", "https://")):
        typer.echo(
            f"error: --attach takes the gateway's http(s) URL, e.g. http://127.0.0.1:9000; "
            f"got {gateway_url!r}",
            err=True,
        )
        raise typer.Exit(2)
    if not 0 <= drain_timeout <= DRAIN_MAX_S:
        typer.echo(
            f"error: --drain-timeout must be seconds within [0, {DRAIN_MAX_S:g}], "
            f"got {drain_timeout:g}",
            err=True,
        )
        raise typer.Exit(2)
    return GatewayAttachment(
        gateway_url,
        token,
        engine_url=advertise_url,
        backend="embedded",
        drain_timeout=drain_timeout,
    )


def _local_model(spec: str, option: str) -> str:
    """A directory as it is, a Hub id as its snapshot in the Hugging Face cache (downloaded
    unless ``HF_HUB_OFFLINE``), as ``areal train`` resolves ``model.path``."""
    from areal.cli.errors import CLIError
    from areal.core.model_source import ModelSourceError, resolve_model

    try:
        return resolve_model(spec, key=option)
    except ModelSourceError as err:
        raise CLIError(str(err)) from None


def _training_option(name: str, **extra: Any) -> Any:
    """A training flag as a typer option: its spelling, default and help from
    :mod:`areal.gateway.training_flags`, as ``python -m areal.gateway.server`` has them."""
    flag = FLAGS[name]
    return typer.Option(
        getattr(DEFAULTS, name), flag.option, metavar=flag.metavar, help=HELP[name], **extra
    )


@app.command("gateway")
def gateway_command(
    config: Path = typer.Option(
        ..., "--config", help="Router YAML: api_gateway (upstream channel) + model_routing."
    ),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to bind (loopback unless --allow-remote)."
    ),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Let --host be an address other machines can reach."
    ),
    ssl_certfile: Path | None = typer.Option(
        None, "--ssl-certfile", help="Serve HTTPS with this certificate chain (PEM)."
    ),
    ssl_keyfile: Path | None = typer.Option(
        None, "--ssl-keyfile", help="The private key of --ssl-certfile (PEM)."
    ),
    port: int = typer.Option(9000, "--port", help="Port to listen on."),
    engine: list[str] = typer.Option(
        [], "--engine", help="URL of a running inference engine (repeatable)."
    ),
    engine_backend: str = typer.Option(
        "embedded",
        "--engine-backend",
        help="The inference backend the --engine URLs run (embedded, sglang, vllm, a plugin's).",
    ),
    model: str | None = typer.Option(
        None, "--model", help="Start an embedded engine on this checkpoint directory or Hub id."
    ),
    tokenizer: str | None = typer.Option(
        None, "--tokenizer", help="Tokenizer directory or Hub id (default: the engine's)."
    ),
    api_key: str | None = typer.Option(
        None,
        "--api-key",
        help="Key for plain calls (default: $AREAL_GATEWAY_KEY, else a random one, printed once).",
    ),
    log_dir: Path | None = typer.Option(
        None, "--log-dir", help="Where gateway.log goes (default: a new temp directory)."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    sink: str = _training_option("sink", show_default=False),
    sink_address: str | None = _training_option("sink_address"),
    staleness_threshold: int | None = _training_option("staleness_threshold"),
    trigger_batch_size: int | None = _training_option("trigger_batch_size"),
    max_concurrent: int | None = _training_option("max_concurrent"),
    start_version: int = _training_option("start_version", show_default=False),
    start_consumed: int = _training_option("start_consumed", show_default=False),
    start_dropped: int = _training_option("start_dropped", show_default=False),
    episode_journal: str | None = _training_option("episode_journal"),
    discount: float = _training_option("discount", show_default=False),
    session_idle_timeout: float = _training_option("session_idle_timeout", show_default=False),
    online: bool = _training_option("online", show_default=False),
    online_idle_timeout: float = _training_option("online_idle_timeout", show_default=False),
    online_reward_wait: float = _training_option("online_reward_wait", show_default=False),
    online_grouping: str = _training_option("online_grouping", show_default=False),
    online_group_window: float = _training_option("online_group_window", show_default=False),
    online_group_size: int = _training_option("online_group_size", show_default=False),
) -> None:
    """Serve the OpenAI/Anthropic-compatible agent gateway in front of the policy's engines.

    Example: [bold]areal serve gateway --config configs/router.yaml --model ./tiny[/bold]

    In a training run: [bold]areal serve gateway --config configs/router.yaml --engine
    http://127.0.0.1:30000 --sink zmq --sink-address tcp://127.0.0.1:5555
    --staleness-threshold 2 --trigger-batch-size 8[/bold]

    For agents deployed elsewhere, calling with the plain key: [bold]--online[/bold].

    Reachable from other machines, over HTTPS: [bold]areal serve gateway --config
    configs/router.yaml --model ./tiny --host 0.0.0.0 --allow-remote --ssl-certfile cert.pem
    --ssl-keyfile key.pem[/bold]
    """
    from areal.cli.errors import CLIError
    from areal.core.config import ConfigError
    from areal.gateway.errors import GatewayError
    from areal.gateway.server import listen_settings, serve

    try:
        listen_settings(
            host,
            allow_remote=allow_remote,
            ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
            ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
        )
    except ValueError as err:
        raise CLIError(str(err)) from None

    training = TrainingFlags(
        sink=sink,
        sink_address=sink_address,
        staleness_threshold=staleness_threshold,
        trigger_batch_size=trigger_batch_size,
        max_concurrent=max_concurrent,
        start_version=start_version,
        start_consumed=start_consumed,
        start_dropped=start_dropped,
        episode_journal=episode_journal,
        discount=discount,
        session_idle_timeout=session_idle_timeout,
        online=online,
        online_idle_timeout=online_idle_timeout,
        online_reward_wait=online_reward_wait,
        online_grouping=online_grouping,
        online_group_window=online_group_window,
        online_group_size=online_group_size,
    )
    try:
        training.check()
    except ValueError as err:
        raise CLIError(str(err)) from None
    try:
        serve(
            str(config),
            host=host,
            port=port,
            engines=engine,
            engine_backend=engine_backend,
            model=model,
            tokenizer=tokenizer,
            api_key=api_key,
            log_dir=str(log_dir) if log_dir else None,
            log_level=log_level,
            training=training,
            allow_remote=allow_remote,
            ssl_certfile=str(ssl_certfile) if ssl_certfile else None,
            ssl_keyfile=str(ssl_keyfile) if ssl_keyfile else None,
        )
    except ConfigError as err:
        raise CLIError(str(err)) from None
    except GatewayError as err:  # e.g. the engine is unreachable at start-up
        raise CLIError(err.message) from None
