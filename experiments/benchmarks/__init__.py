"""The sections of ``python -m experiments.bench``, one module per kind of work."""
