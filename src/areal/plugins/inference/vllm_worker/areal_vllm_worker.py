"""Loaded by vLLM's workers (``--worker-extension-cls``), not by areal: it runs in vLLM's own
venv, where areal is not installed, so it imports nothing of areal's.

vLLM 0.32's in-place ``reload_weights`` leaves a tied LM head (one that shares the input
embedding's weight, as small Qwen models do) computing with the old weights: the checkpoint names
only the embedding, so only the embedding's post-load processing runs again, and the head keeps
the kernel state derived from the old weight (on CPU, the packed copy its GEMM uses). The logits
then come from a mix of two checkpoints. :meth:`AReaLWorkerExtension.areal_reload_weights` notes
which modules share a parameter before the reload, ties them again after it if the reload split
them, and re-runs post-load processing on every one of them.
"""

from __future__ import annotations

from typing import Any


class AReaLWorkerExtension:
    """Methods areal calls on every worker through ``/collective_rpc``."""

    model_runner: Any

    def areal_reload_weights(self, weights_path: str) -> int:
        """``reload_weights`` from ``weights_path`` keeping tied parameters tied; returns how
        many modules were tied again."""
        model = self.model_runner.get_model()
        owners: dict[int, list[tuple[Any, str]]] = {}
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                owners.setdefault(id(param), []).append((module, name))
        shared = [(pid, group) for pid, group in owners.items() if len(group) > 1]
        self.model_runner.reload_weights(weights_path=weights_path)
        retied = 0
        for old_id, group in shared:
            # A member the reload gave a new tensor holds the checkpoint's values (else the
            # values were copied into the shared tensor itself).
            fresh = [getattr(m, n) for m, n in group if id(getattr(m, n)) != old_id]
            for module, name in group:
                if fresh and getattr(module, name) is not fresh[0]:
                    setattr(module, name, fresh[0])
                # Post-load processing derives kernel state from the weight (on CPU, a packed
                # copy for the GEMM): the member the checkpoint does not name never got it.
                method = getattr(module, "quant_method", None)
                if method is not None and hasattr(method, "process_weights_after_loading"):
                    method.process_weights_after_loading(module)
                    retied += 1
        return retied
