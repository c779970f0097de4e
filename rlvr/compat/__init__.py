"""Compatibility with other systems' conventions, one sub-package per system (``slime``)."""
