"""The contracts: hookspecs, plugin manager, registries, specs, records, the run-config schema,
staleness arithmetic, and the engine, agent and launcher contracts. Torch-free at import time.

Its rule: it imports only ``areal.core`` and ``areal.host``. Code that needs nothing of areal
(processes, ports, event loops, servers) lives in ``areal.host``; a backend's own client lives
with its backend in ``areal.plugins``.
"""
