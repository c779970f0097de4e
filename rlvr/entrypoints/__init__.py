"""What a user runs: the ``rlvr`` command (``cli``) and its sub-commands' drivers (``sft``,
``evaluate``, ``demo``)."""
