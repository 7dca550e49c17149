"""Registries: duplicates name both plugins, unknown names list what exists."""

from __future__ import annotations

import pluggy
import pytest

from areal.core import hookspecs
from areal.core.hookspecs import hookimpl
from areal.core.registry import Registry, RegistryError, call_impl, collect


def test_add_and_get() -> None:
    reg: Registry[int] = Registry("loss")
    reg.add("ppo", 1, owner="builtin")
    reg.add("grpo", 2, owner="builtin")
    assert reg.get("ppo") == 1
    assert reg.names() == ["grpo", "ppo"]
    assert "grpo" in reg and "nope" not in reg
    assert len(reg) == 2
    assert reg.owners["ppo"] == "builtin"


def test_an_alias_is_the_same_thing_under_another_name() -> None:
    from areal.core.specs import TrainEngineSpec

    fsdp = TrainEngineSpec("fsdp", "m:b", "m:f", "m:p", "m:s")
    lookalike = TrainEngineSpec("fsdp", "n:b", "n:f", "n:p", "n:s")  # equal name, other thing
    reg: Registry[TrainEngineSpec] = Registry("training engine")
    reg.add("archon", fsdp, owner="builtin")  # before its target: order does not matter
    reg.add("fsdp", fsdp, owner="builtin")
    reg.add("other", lookalike, owner="areal-other")
    assert reg.get("archon") is reg.get("fsdp")
    assert reg.aliases() == {"archon": "fsdp"}
    assert reg.implementations() == ["fsdp", "other"]
    assert reg.names() == ["archon", "fsdp", "other"]  # every accepted name


def test_duplicate_names_both_owners() -> None:
    reg: Registry[int] = Registry("loss")
    reg.add("ppo", 1, owner="areal.plugins.losses.register")
    with pytest.raises(RegistryError) as err:
        reg.add("ppo", 2, owner="areal-fancy-loss")
    assert "areal.plugins.losses.register" in str(err.value)
    assert "areal-fancy-loss" in str(err.value)
    assert "'ppo'" in str(err.value)


def test_unknown_name_lists_names_and_config_key() -> None:
    reg: Registry[int] = Registry("reward")
    reg.add("math_verify", 1, owner="x")
    reg.add("exact_match", 2, owner="x")
    with pytest.raises(RegistryError) as err:
        reg.get("f1", key="agent.reward_source")
    message = str(err.value)
    assert "unknown reward 'f1'" in message
    assert "agent.reward_source" in message
    assert "exact_match, math_verify" in message


def test_unknown_name_in_empty_registry() -> None:
    with pytest.raises(RegistryError, match="registered: none"):
        Registry("queue").get("zmq")


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_names_are_rejected(bad: object) -> None:
    with pytest.raises(RegistryError, match="empty or non-string"):
        Registry("loss").add(bad, 1, owner="p")  # type: ignore[arg-type]


class _Losses:
    @hookimpl
    def areal_register_losses(self, register):
        register("clip", "clip-loss")
        register("kl", "kl-loss")


class _NoArgs:
    """pluggy lets an implementation take fewer arguments than the spec; it registers nothing."""

    @hookimpl
    def areal_register_losses(self):
        return None


class _Wrapper:
    @hookimpl(wrapper=True)
    def areal_register_losses(self, register):
        return (yield)


def _pm(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"p{i}")
    return pm


def test_collect_gathers_with_owners_and_skips_wrappers() -> None:
    pm = _pm(_Losses(), _NoArgs(), _Wrapper())
    reg = collect(pm.hook.areal_register_losses, "loss", pm.get_name)
    assert reg.entries == {"clip": "clip-loss", "kl": "kl-loss"}
    assert reg.owners == {"clip": "p0", "kl": "p0"}


def test_collect_only_one_plugin_ignores_a_clash_elsewhere() -> None:
    pm = _pm(_Losses(), _Losses(), _Losses())
    with pytest.raises(RegistryError, match="by p0 and by p1"):
        collect(pm.hook.areal_register_losses, "loss", pm.get_name)
    only = collect(pm.hook.areal_register_losses, "loss", pm.get_name, only="p2")
    assert only.owners == {"clip": "p2", "kl": "p2"}


def test_call_impl_passes_only_declared_arguments() -> None:
    pm = _pm(_NoArgs())
    (impl,) = pm.hook.areal_register_losses.get_hookimpls()
    assert call_impl(impl, register=print, future_argument=1) is None
