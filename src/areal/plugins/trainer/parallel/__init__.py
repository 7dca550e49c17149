"""The PyTorch-native 5D engine: one DeviceMesh (:mod:`.parallel_dims`), parallelism applied to
plain model code from outside (:mod:`.parallelize`), the RL step across ranks (:mod:`.layout`, :mod:`.pipeline`)."""
