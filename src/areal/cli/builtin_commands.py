"""Built-in CLI command groups, added through ``areal_register_commands`` like a plugin's."""

from __future__ import annotations

from typing import Any

from areal.core.hookspecs import hookimpl


@hookimpl
def areal_register_commands(cli: Any) -> None:
    from areal.cli import (
        check_channel_cmd,
        config_cmd,
        doctor_cmd,
        model_cmd,
        monitor_cmd,
        plot_cmd,
        plug_cmd,
        probe_cmd,
        serve_cmd,
        train_cmd,
    )

    cli.command("train")(train_cmd.train_command)
    cli.command("monitor")(monitor_cmd.monitor_command)
    cli.command("plot")(plot_cmd.plot_command)
    cli.command("probe")(probe_cmd.probe_command)
    cli.command("check-channel")(check_channel_cmd.check_channel_command)
    cli.command("doctor")(doctor_cmd.doctor_command)
    cli.add_typer(plug_cmd.app, name="plug")
    cli.add_typer(model_cmd.app, name="model")
    cli.add_typer(serve_cmd.app, name="serve")
    cli.add_typer(config_cmd.app, name="config")
