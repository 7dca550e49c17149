"""The framework kernel: hookspecs, plugin manager, registries. Torch-free at import time."""
