"""``python -m rlvr.export_hf``: seed 003's export command (``__main__``)."""
