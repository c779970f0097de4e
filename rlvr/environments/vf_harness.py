"""verifiers' ``null`` chat harness, its program run by the interpreter verifiers is installed in.

verifiers' harnesses launch their chat program as a PEP 723 script for which ``uv`` builds a venv
(downloading ``uv`` and the script's packages), which needs the network at run time. The
program's dependencies (openai, mcp, httpx, tenacity, certifi) are verifiers' own, so the same
program text (``CHAT_PROGRAM_SOURCE``: the chat loop, MCP tool calls, the tool gate) runs
unchanged under ``sys.executable``; the arguments are built by verifiers' ``launch_chat_program``.
Only ``prepare_uv_script`` is replaced, on a view of the runtime.

verifiers resolves a harness id by importing the module it names (a top-level name: it first
looks under ``verifiers.v1.harnesses``) and taking the ``Harness`` subclass in ``__all__``; rlvr
registers this module as ``HARNESS_ID`` before it loads an environment.
"""

from __future__ import annotations

import hashlib
import sys

from verifiers.v1.harnesses.null.harness import NullHarness
from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE, launch_chat_program

HARNESS_ID = "rlvr_local_chat"


class _InstalledPython:
    """A runtime whose PEP 723 scripts run under this interpreter (their packages are installed)."""

    def __init__(self, runtime):
        self._runtime = runtime

    def __getattr__(self, name):
        return getattr(self._runtime, name)

    async def prepare_uv_script(self, script, env=None, *, activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = f".vf-program-{hashlib.sha256(data).hexdigest()[:16]}.py"
        await self._runtime.write(path, data)
        return [sys.executable, path]


class LocalChatHarness(NullHarness):
    async def setup(self, runtime) -> None:
        """Nothing to build: the program's packages are installed."""

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, tool_interception_url=None):
        system_prompt, prompt = self.resolve_prompt(data)
        extra = [f"--tool-interception-url={tool_interception_url}"] if tool_interception_url else []
        return await launch_chat_program(CHAT_PROGRAM_SOURCE, self.config, ctx, trace, _InstalledPython(runtime), endpoint,
                                         secret, mcp_urls, system_prompt, prompt, extra_args=extra)


__all__ = ["LocalChatHarness"]
