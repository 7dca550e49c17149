"""Loaded by vLLM's workers (``--worker-extension-cls``), not by areal: it runs in vLLM's own
venv, where areal is not installed, so it imports nothing of areal's as a package (the weight
group's file is loaded by its path, below).

**Weights from disk.** vLLM 0.32's in-place ``reload_weights`` leaves a tied LM head (one that
shares the input embedding's weight, as small Qwen models do) computing with the old weights: the
checkpoint names only the embedding, so only the embedding's post-load processing runs again, and
the head keeps the kernel state derived from the old weight (on CPU, the packed copy its GEMM
uses). The logits then come from a mix of two checkpoints. :meth:`areal_reload_weights` notes
which modules share a parameter before the reload, ties them again after it if the reload split
them, and re-runs post-load processing on every one of them.

**Weights by broadcast** (areal's collective weight sync, as SGLang receives it): the trainer is
rank 0 of a group formed key for key as SGLang forms it (``areal/core/weight_group.py``, loaded
from areal's source tree beside this file), each worker rank ``rank_offset`` plus its
tensor-parallel rank. A sync sends its weights in buckets, one ``/collective_rpc`` call per
bucket while rank 0 broadcasts it; the model takes them in checkpoint format through vLLM's
layerwise reload, which processes a layer (fused projections, the CPU's packed GEMM copy) once
all its weights arrived, so a layer split over two buckets is fine. The call that ends the sync
(``finish``) finalizes the reload and ties shared parameters again, as above.

**A step gate**, for tests that act while a request runs (an abort, a pause for a weight update):
vLLM's API server relays tokens behind its engine by a margin no client sees, so "the request is
still running when the act lands" cannot be arranged from outside. Armed with two named pipes,
each engine step that runs the model first takes one byte from the first pipe (a release) and
then writes one to the second (done): the engine makes exactly the steps a test lets it, and the
test knows when it made them. A release of ``o`` opens the gate for good.

**Behaviour log-probs.** The log-prob reported with a sampled token is log softmax(z / T) over the
whole vocabulary, z the model's logits and T the request's temperature: the distribution the
trainer recomputes from the weights and the temperature alone (docs/training.md). vLLM offers no
such mode: its default ``raw_logprobs`` is log softmax(z), before the temperature, and its
``processed_logprobs`` is taken after min-p, top-k and top-p removed tokens, renormalised over
the ones kept. Importing this module (vLLM does, in each worker process, before it builds the
worker and its model runner) makes the sampler's ``raw_logprobs`` divide each row by its
temperature first, from the logits as they were before a grammar's mask
(:func:`install_behaviour_logprobs`); grammars, penalties, ``logit_bias``, min-p, top-k and top-p
still decide which token is drawn, not the probability reported for it. Greedy rows
(temperature 0, or top-k 1) keep log softmax(z), as the trainer's ``training_temperature`` reads
them. This is the sampler of vLLM's V1 model runner; areal's launcher keeps GPU servers on it
(``VLLM_USE_V2_MODEL_RUNNER=0``), and :meth:`AReaLWorkerExtension.areal_behaviour_logprobs` says
whether a running server reports these log-probs.
"""

from __future__ import annotations

import datetime
import functools
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

OPEN = b"o"  # a release that opens the step gate for good

# areal/plugins/inference/vllm_worker/ -> areal/core/weight_group.py
WEIGHT_GROUP_PY = Path(__file__).resolve().parents[3] / "core" / "weight_group.py"


@functools.cache
def _weight_group() -> ModuleType:
    spec = importlib.util.spec_from_file_location("areal_weight_group", WEIGHT_GROUP_PY)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load areal's weight group from {WEIGHT_GROUP_PY}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _shared_parameters(model: Any) -> list[tuple[int, list[tuple[Any, str]]]]:
    """(id of the parameter, its (module, name) owners) for every parameter owned twice."""
    owners: dict[int, list[tuple[Any, str]]] = {}
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append((module, name))
    return [(pid, group) for pid, group in owners.items() if len(group) > 1]


def _tie_again(shared: list[tuple[int, list[tuple[Any, str]]]]) -> int:
    """After a reload: the members of each shared parameter hold one tensor again, with its
    post-load processing run on each; returns how many modules were processed again."""
    retied = 0
    for old_id, group in shared:
        # A member the reload gave a new tensor holds the checkpoint's values (else the values
        # were copied into the shared tensor itself).
        fresh = [getattr(m, n) for m, n in group if id(getattr(m, n)) != old_id]
        for module, name in group:
            if fresh and getattr(module, name) is not fresh[0]:
                setattr(module, name, fresh[0])
            # Post-load processing derives kernel state from the weight (on CPU, a packed copy
            # for the GEMM): the member the checkpoint does not name never got it.
            method = getattr(module, "quant_method", None)
            if method is not None and hasattr(method, "process_weights_after_loading"):
                method.process_weights_after_loading(module)
                retied += 1
    return retied


# vLLM's temperature below which a request is greedy (``vllm.sampling_params._SAMPLING_EPS``)
GREEDY_TEMPERATURE = 1e-5


def behaviour_temperatures(metadata: Any) -> Any:
    """Each row's temperature of the distribution its log-prob is reported under, as a tensor
    ``[rows]``, or ``None`` when every row is greedy: 1 for greedy rows (vLLM holds 0 there) and
    for rows with top-k 1, as areal's trainer reads them."""
    import torch

    temperature = metadata.temperature
    if temperature is None:  # vLLM leaves it out when the whole batch is greedy
        return None
    scale = torch.where(temperature < GREEDY_TEMPERATURE, 1.0, temperature.float())
    if metadata.top_k is not None:
        scale = torch.where(metadata.top_k == 1, 1.0, scale)
    return scale


def install_behaviour_logprobs() -> bool:
    """Make vLLM's V1 sampler report log softmax(z / T) as its ``raw_logprobs`` (module
    docstring); once per process. ``False`` when it was already installed.

    The sampler computes ``raw_logprobs`` (``compute_logprobs``) from the logits it is given,
    before its own penalties, ``logit_bias``, temperature and truncation; the wrapped ``forward``
    hands it the batch's temperatures for that one call, one row per request. The model runner
    masks those logits with a request's grammar (``apply_grammar_bitmask``, in place) before it
    calls the sampler, so the wrapped mask keeps the unmasked logits for that call: a token a
    grammar forces reports its unmasked log-prob too. The sampler's other callers (prompt
    log-probs, the accepted tokens of speculative decoding) and the bonus-token call of
    speculative decoding, whose rows are not one per request, keep vLLM's own log softmax(z)."""
    import torch
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.worker import gpu_model_runner

    if getattr(Sampler.forward, "areal_behaviour_logprobs", False):
        return False
    plain_forward = Sampler.forward
    plain_mask = gpu_model_runner.apply_grammar_bitmask
    # the logits the runner last masked, and a copy from before the mask; read by the next
    # sampler call, which gets exactly that tensor (``GPUModelRunner.sample_tokens``)
    unmasked: dict[str, tuple[Any, Any]] = {}

    @functools.wraps(plain_mask)
    def apply_grammar_bitmask(
        scheduler_output: Any, grammar_output: Any, input_batch: Any, logits: Any
    ) -> Any:
        unmasked["last"] = (logits, logits.clone())
        return plain_mask(scheduler_output, grammar_output, input_batch, logits)

    @functools.wraps(plain_forward)
    def forward(
        self: Any,
        logits: Any,
        sampling_metadata: Any,
        predict_bonus_token: bool = False,
        logprobs_mode_override: Any = None,
    ) -> Any:
        own_rows = not predict_bonus_token and logprobs_mode_override is None
        masked, before = unmasked.pop("last", (None, None))
        self.__dict__["_areal_scale"] = (
            behaviour_temperatures(sampling_metadata) if own_rows else None
        )
        self.__dict__["_areal_source"] = before if own_rows and masked is logits else None
        try:
            return plain_forward(
                self, logits, sampling_metadata, predict_bonus_token, logprobs_mode_override
            )
        finally:
            self.__dict__["_areal_scale"] = self.__dict__["_areal_source"] = None

    def compute_logprobs(self: Any, logits: Any) -> Any:
        source = self.__dict__.get("_areal_source")
        if source is not None:  # the call's logits as they were before the grammar's mask
            logits = source
        scale = self.__dict__.get("_areal_scale")
        if scale is not None:  # a new tensor: the sampler goes on with the logits it was given
            logits = logits.to(torch.float32) / scale[:, None]
        return logits.log_softmax(dim=-1, dtype=torch.float32)

    for wrapped in (forward, apply_grammar_bitmask):
        setattr(wrapped, "areal_behaviour_logprobs", True)  # noqa: B010 (no such field declared)
    Sampler.forward = forward
    Sampler.compute_logprobs = compute_logprobs
    gpu_model_runner.apply_grammar_bitmask = apply_grammar_bitmask
    return True


if "vllm" in sys.modules:  # imported by vLLM (not by a tool reading areal's source tree)
    install_behaviour_logprobs()


class AReaLWorkerExtension:
    """Methods areal calls on every worker through ``/collective_rpc``."""

    model_runner: Any
    vllm_config: Any
    execute_model: Any  # vLLM's worker's; the step gate shadows it on the instance

    def areal_reload_weights(self, weights_path: str) -> int:
        """``reload_weights`` from ``weights_path`` keeping tied parameters tied; returns how
        many modules were tied again."""
        shared = _shared_parameters(self.model_runner.get_model())
        self.model_runner.reload_weights(weights_path=weights_path)
        return _tie_again(shared)

    # --- weights by broadcast -----------------------------------------------------------------

    def _areal_state(self) -> dict[str, Any]:
        # groups: name -> (group, device); shared: the tied parameters while a sync runs
        return self.__dict__.setdefault("_areal", {"groups": {}, "shared": None})

    def areal_init_weights_update_group(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float = 300.0,
    ) -> int:
        """Join the trainer's group as ``rank_offset`` + this worker's tensor-parallel rank;
        returns that rank. A sync cut short in an earlier group is finished first (its model
        left half reloaded would not run)."""
        import torch
        import torch.distributed as dist
        from vllm.distributed import get_tensor_model_parallel_rank

        state = self._areal_state()
        if group_name in state["groups"]:
            raise ValueError(f"weight update group {group_name!r} already exists")
        self._areal_finish_reload()
        rank = rank_offset + get_tensor_model_parallel_rank()
        if not 0 < rank < world_size:
            raise ValueError(f"rank {rank} must be in [1, world_size={world_size})")
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(master_address, master_port, world_size, False, timeout=timeout)
        group = _weight_group().new_weight_group(
            store,
            rank=rank,
            world_size=world_size,
            group_name=group_name,
            backend=backend,
            timeout=timeout,
        )
        on_gpu = backend == "nccl"
        device = (
            torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        )
        state["groups"][group_name] = (group, device)
        return rank

    def areal_update_weights_from_distributed(
        self,
        group_name: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        flattened: bool,
        finish: bool,
    ) -> int:
        """Receive one bucket from rank 0 and load it; ``finish``: the sync's last bucket, the
        reload is finalized. Returns how many tensors were loaded."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        state = self._areal_state()
        if group_name not in state["groups"]:
            raise ValueError(f"no weight update group named {group_name!r}; join it first")
        if len(names) != len(shapes):
            raise ValueError("names, dtypes and shapes must have the same length")
        group, device = state["groups"][group_name]
        model = self.model_runner.get_model()
        try:
            tensors = _weight_group().receive_tensors(
                group, dtypes=dtypes, shapes=shapes, flattened=flattened, device=device
            )
            with set_current_vllm_config(self.vllm_config):
                if state["shared"] is None:  # the sync's first bucket
                    state["shared"] = _shared_parameters(model)
                    initialize_layerwise_reload(model)
                model.load_weights(list(zip(names, tensors, strict=True)))
        except BaseException:  # a broadcast cut short: the group is spent, the model must run
            state["groups"].pop(group_name, None)
            self._areal_finish_reload()
            raise
        if finish:
            self._areal_finish_reload()
        return len(names)

    def _areal_finish_reload(self) -> None:
        """End the reload a sync began: layers that got all their weights run on them, the
        others on what they had; shared parameters tied again; the model runner's caches of
        derived state reset, as its own ``reload_weights`` does."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        state = self._areal_state()
        shared, state["shared"] = state["shared"], None
        if shared is None:
            return
        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self.model_runner.get_model(), self.vllm_config.model_config)
        _tie_again(shared)
        for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):
            getattr(self.model_runner, reset, lambda: None)()

    def areal_destroy_weights_update_group(self, group_name: str) -> bool:
        state = self._areal_state()
        if state["groups"].pop(group_name, None) is None:
            raise ValueError(f"no weight update group named {group_name!r}")
        return True

    def areal_behaviour_logprobs(self) -> dict[str, Any]:
        """What this worker reports as a sampled token's log-prob: ``exact`` when it is
        log softmax(z / T) over the whole vocabulary (module docstring), else why not."""
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.worker import gpu_model_runner

        sampler = getattr(self.model_runner, "sampler", None)
        kind = f"{type(sampler).__module__}.{type(sampler).__qualname__}"
        why = None
        if not isinstance(sampler, Sampler):
            why = f"the sampler is {kind}: run vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)"
        elif not getattr(type(sampler).forward, "areal_behaviour_logprobs", False):
            why = "the sampler was not wrapped"
        elif not getattr(gpu_model_runner.apply_grammar_bitmask, "areal_behaviour_logprobs", False):
            why = "the grammar mask was not wrapped"
        elif sampler.logprobs_mode != "raw_logprobs":
            why = f"--logprobs-mode is {sampler.logprobs_mode}; areal needs raw_logprobs"
        elif self.vllm_config.speculative_config is not None:
            why = "speculative decoding reports its accepted tokens' log softmax(z)"
        return {"exact": why is None, "why": why, "sampler": kind}

    # --- a step gate, for tests ---------------------------------------------------------------

    def areal_step_gate(self, release_path: str, done_path: str) -> bool:
        """Hold every engine step that runs the model until a byte arrives on the named pipe
        ``release_path`` (:data:`OPEN` opens the gate), and write a byte on ``done_path`` after
        each step it let through. Replaces a gate armed before."""
        self._areal_open_gate()  # an earlier gate, still armed
        ungated = self.execute_model
        # O_RDWR: neither open waits for the other end, and a read never sees end-of-file.
        release, done = os.open(release_path, os.O_RDWR), os.open(done_path, os.O_RDWR)
        self._areal_state()["gate"] = (release, done)

        def gated(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            if scheduler_output.total_num_scheduled_tokens == 0:  # nothing to run: no step
                return ungated(scheduler_output, *args, **kwargs)
            if os.read(release, 1) == OPEN:
                self._areal_open_gate()
                return ungated(scheduler_output, *args, **kwargs)
            output = ungated(scheduler_output, *args, **kwargs)
            os.write(done, b".")
            return output

        self.execute_model = gated
        return True

    def _areal_open_gate(self) -> None:
        self.__dict__.pop("execute_model", None)
        for fd in self._areal_state().pop("gate", None) or ():
            os.close(fd)
