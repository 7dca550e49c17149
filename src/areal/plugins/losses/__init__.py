"""Built-in losses (decoupled PPO, plain PPO, SAPO, CISPO, Clip-Cov, KL-Cov) and the advantage
estimators (GRPO, RLOO, GAE without a critic).

Pure functions over tensors (:mod:`.ppo`, :mod:`.sapo`, :mod:`.cispo`, :mod:`.cov`,
:mod:`.advantages`, with the shared pieces in :mod:`.ratio`, :mod:`.behavior_weight`,
:mod:`.stats`, :mod:`.tokens`); :mod:`areal.core.loss_options` checks a loss's options by its
signature; :mod:`.register` puts them in the loss registry by name without importing torch.
"""
