"""Seeing what a loader does: ``stats()`` and its advice, the profiler's
trace, and ``tune`` (measured sweeps of workers and prefetch)."""
