"""``python -m rlvr.export_hf``: the nested config's export command (``__main__``)."""
