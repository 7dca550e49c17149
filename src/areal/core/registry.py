"""Named registries filled by the ``areal_register_*`` hooks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from areal.core.plugin_trace import trace_requested, traced_call

T = TypeVar("T")


class RegistryError(ValueError):
    """A duplicate registration, or a name that nothing registered."""


@dataclass
class Registry(Generic[T]):
    """Things of one kind (model families, losses, ...) by name, with the plugin that gave each."""

    kind: str
    entries: dict[str, T] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, thing: T, owner: str) -> None:
        if not isinstance(name, str) or not name:
            raise RegistryError(
                f"{owner} registered a {self.kind} with an empty or non-string name"
            )
        if name in self.entries:
            raise RegistryError(
                f"{self.kind} {name!r} is registered twice: by {self.owners[name]} and by {owner}"
            )
        self.entries[name] = thing
        self.owners[name] = owner

    def get(self, name: str, *, key: str | None = None) -> T:
        """Look ``name`` up; an unknown name raises an error that lists the registered ones.

        ``key`` is the config key the name came from, so the error can point at it.
        """
        try:
            return self.entries[name]
        except KeyError:
            where = f" (config key {key})" if key else ""
            known = ", ".join(sorted(self.entries)) or "none"
            raise RegistryError(
                f"unknown {self.kind} {name!r}{where}; registered: {known}"
            ) from None

    def names(self) -> list[str]:
        """Every accepted name, aliases included."""
        return sorted(self.entries)

    def aliases(self) -> dict[str, str]:
        """Alias -> the name it stands for: a thing registered under a name other than its own
        ``name`` while also registered under that one (``archon`` for the ``fsdp`` engine)."""
        found = {}
        for name, thing in self.entries.items():
            own = getattr(thing, "name", None)
            if isinstance(own, str) and own != name and self.entries.get(own) is thing:
                found[name] = own
        return found

    def implementations(self) -> list[str]:
        """The names that are not aliases: one per distinct thing a listing should show."""
        aliases = self.aliases()
        return [name for name in self.names() if name not in aliases]

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __len__(self) -> int:
        return len(self.entries)


def call_impl(impl: Any, **kwargs: Any) -> Any:
    """Call one hook implementation directly, passing only the arguments it declares.

    pluggy lets an implementation accept a subset of the spec's arguments (so hooks can gain
    arguments without breaking old plugins); calling ``impl.function`` by hand must do the same,
    and is traced as pluggy's calls are (``AREAL_TRACE_PLUGINS``).
    """
    given = {name: kwargs[name] for name in impl.argnames if name in kwargs}
    if trace_requested():
        hook = impl.function.__name__
        return traced_call(hook, impl.plugin_name, given, lambda: impl.function(**given))
    return impl.function(**given)


def collect(hook: Any, kind: str, plugin_name_of: Any, *, only: str | None = None) -> Registry[Any]:
    """Call one ``areal_register_*`` hook on every plugin and gather what they register.

    Each plugin gets its own ``register`` callback so duplicates name both plugins. ``only``
    restricts the call to one plugin (``areal plug info`` shows what that plugin gives).
    Wrappers are skipped: they time or trace hook calls and register nothing.
    """
    registry: Registry[Any] = Registry(kind)
    for impl in hook.get_hookimpls():
        if impl.hookwrapper or impl.wrapper:
            continue
        owner = plugin_name_of(impl.plugin)
        if only is not None and owner != only:
            continue

        def register(name: str, thing: Any, _owner: str = owner) -> None:
            if trace_requested():
                what = {"name": name, "thing": thing}
                traced_call(
                    f"register {kind}", _owner, what, lambda: registry.add(name, thing, _owner)
                )
                return
            registry.add(name, thing, _owner)

        call_impl(impl, register=register)
    return registry
