"""Built-in losses: decoupled PPO and the advantage estimators (GRPO, RLOO, GAE without a critic).

Pure functions over tensors (:mod:`.ppo`, :mod:`.advantages`); :mod:`.register` puts them in the
loss registry by name without importing torch.
"""
