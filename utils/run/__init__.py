"""A run's life: clean stops on signals, the launcher lifeline, the run lock, the run's folders. The checks
before the launch, which ask every room, are utils/preflight.py."""
