"""Built-in launchers: this machine, a Ray cluster, a Slurm allocation."""
