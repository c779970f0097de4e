"""The bottom layer: the types every role passes around (``Sample``, ``RolloutBatch``), errors,
the registry, small I/O helpers (JSONL), device resolution and test-time switches. Imports nothing
else of rlvr."""
