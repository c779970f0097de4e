"""Wiring: the driver (``loop``), the builders that turn a ``Config`` into components (``build``),
colocation of trainer and engine on one device (``colocate``) and checkpoints (``checkpoint``)."""
