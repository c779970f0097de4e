"""``python -m rlvr.environments.openenv_server module:Class PORT``: an OpenEnv HTTP/WebSocket server
for an OpenEnv ``Environment`` subclass on 127.0.0.1 (uvicorn), as ``--environment openenv:module:Class``
starts it. The action and observation classes are read from ``step``'s type hints
(``def step(self, action: MyAction) -> MyObservation``).
"""

from __future__ import annotations

import sys
import typing


def action_observation(cls) -> tuple[type, type]:
    """``step``'s action parameter type and return type, or a message saying what to annotate."""
    hints = typing.get_type_hints(cls.step)
    params = [k for k in hints if k != "return"]
    if not params or "return" not in hints:
        raise TypeError(f"{cls.__name__}.step needs type hints for rlvr to serve it: "
                        "def step(self, action: MyAction) -> MyObservation")
    return hints[params[0]], hints["return"]


def main() -> None:
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    from rlvr.core.registry import load_function

    spec, port = sys.argv[1], int(sys.argv[2])
    cls = load_function(spec, "--environment")
    action_cls, observation_cls = action_observation(cls)
    app = create_fastapi_app(cls, action_cls, observation_cls, max_concurrent_envs=256)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
