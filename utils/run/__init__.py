"""A run's life: clean stops on signals, the launcher lifeline, the run lock, the run's folders, the checks
before the launch (preflight)."""
