"""Built-in launchers: where a run's processes run (Slurm here; local is the supervisor's own)."""
