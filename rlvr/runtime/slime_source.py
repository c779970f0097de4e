"""slime's ``--data-source-path`` class as an rlvr ``DataSource``."""

from __future__ import annotations

from rlvr.compat.slime.plugins import SlimeArgs
from rlvr.core.registry import load_function
from rlvr.data.dataset import DataSource, PromptRecord


def slime_data_source(path: str, args: SlimeArgs):
    """``--data-source-path``: slime's ``DataSource`` class (``cls(args)`` with ``get_samples(n) ->
    list[list[Sample]]``) as rlvr's data source. rlvr reads each group's first sample's
    ``prompt``, ``label`` and ``metadata`` and makes the group itself; aborted partial groups stay in
    rlvr's own buffer (slime hands them to ``add_samples``). Resume replays the source: a restored
    run draws and discards the prompts drawn before the checkpoint, so a deterministic source
    continues where it stopped (slime's ``save``/``load`` are not called)."""
    user = load_function(path, "--data-source-path")(args)

    class SlimeDataSource(DataSource):
        def __init__(self):
            super().__init__([], shuffle=False)
            self.user, self.drawn = user, 0

        @property
        def position(self) -> int:
            return self.drawn

        def next_prompts(self, n: int) -> list[PromptRecord]:
            groups = self.user.get_samples(n)
            if len(groups) != n:
                raise ValueError(f"--data-source-path {path}: get_samples({n}) returned {len(groups)} groups")
            first = [g[0] if isinstance(g, (list, tuple)) else g for g in groups]
            out = [PromptRecord(self.drawn + i, s.prompt, s.label, dict(s.metadata or {})) for i, s in enumerate(first)]
            self.drawn += n
            return out

        def state_dict(self) -> dict:
            return {**super().state_dict(), "drawn": self.drawn}

        def load_state_dict(self, state: dict) -> None:
            super().load_state_dict({**state, "epoch": 0, "offset": 0})
            if state["drawn"]:
                self.user.get_samples(state["drawn"])  # replay to where the checkpoint was
            self.drawn = state["drawn"]

    return SlimeDataSource()
