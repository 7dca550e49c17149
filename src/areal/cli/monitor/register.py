"""The live monitor's own panels, registered through ``areal_register_monitor_panels`` like a
plugin's (``areal monitor`` draws them as its grid, then every other registered panel)."""

from __future__ import annotations

from areal.core.hookspecs import Register, hookimpl


@hookimpl
def areal_register_monitor_panels(register: Register) -> None:
    from areal.cli.monitor.render import built_in_panels

    for name, panel in built_in_panels().items():
        register(name, panel)
