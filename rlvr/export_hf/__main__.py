"""``python -m rlvr.export_hf``: the nested config's ``python -m slime.export_hf`` command.

``--megatron_ckpt DIR/rollout_N --output_dir OUT`` is ``rlvr export DIR/rollout_N OUT``
(``rlvr.compat.slime.seed_commands.export_argv``): a plain Hugging Face checkpoint, model and
tokenizer, from a training checkpoint.
"""

import sys

from rlvr.compat.slime.seed_commands import export_argv
from rlvr.entrypoints.cli import main

if __name__ == "__main__":
    sys.exit(main(["export", *export_argv(sys.argv[1:])]))
