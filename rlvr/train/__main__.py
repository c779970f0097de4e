"""``python -m rlvr.train``: the nested config's ``python -m slime.train`` command, flags and all.

``--config FILE --experiment_name NAME --output_dir DIR [--resume_from DIR/rollout_N]`` plus any
``rlvr train`` flag; ``rlvr.compat.slime.seed_commands.train_argv`` says what each becomes.
"""

import sys

from rlvr.compat.slime.seed_commands import TRAIN_USAGE, train_argv
from rlvr.entrypoints.cli import main

if __name__ == "__main__":
    if {"-h", "--help"} & set(sys.argv[1:]):
        print(TRAIN_USAGE)
    sys.exit(main(["train", *train_argv(sys.argv[1:])]))
