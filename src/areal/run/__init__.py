"""Puts a run together and keeps it alive: the processes, their supervision, the rollout workers, the trainer loop, checkpoints (``areal train`` reads top to bottom from :mod:`.runner`)."""
