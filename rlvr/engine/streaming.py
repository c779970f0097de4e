"""Token streams: an engine's tokens as they are sampled, and the text deltas of server-sent events.

``stream_generate(engine, request)`` yields increments of one request's result: ``GenerateResult``s
holding the tokens sampled since the last one (finish reason ``""``), then a last one with the
finish reason. The embedded engine streams token by token (``EmbeddedEngine.stream``); other engines
(HTTP, Ray actors) give their whole result as one increment (``Engine.stream``'s default).

``TextStream`` turns token increments into text deltas that are safe to send: the text up to the
first "held" string (a stop string, ``<tool_call>``: what follows is not content), never a
trailing piece that may still become one, nor half a UTF-8 character.

>>> safe_prefix("12 <tool", ("<tool_call>",)), safe_prefix("ab<tool_call>{", ("<tool_call>",))
('12 ', 'ab')
>>> safe_prefix("caf\\ufffd", ())
'caf'
"""

from __future__ import annotations

from typing import AsyncIterator

from rlvr.engine.base import Engine, GenerateRequest, GenerateResult


def stream_generate(engine: Engine, request: GenerateRequest) -> AsyncIterator[GenerateResult]:
    """Increments of ``request``'s result (module docstring): the engine's ``stream``."""
    return engine.stream(request)


def safe_prefix(text: str, holds: tuple[str, ...]) -> str:
    """The part of ``text`` that no held string can claim (see the module docstring)."""
    cut = min((text.index(h) for h in holds if h in text), default=len(text))
    text = text[:cut].rstrip("\ufffd")  # a byte-level token may end inside a character
    for h in holds:
        for k in range(min(len(h) - 1, len(text)), 0, -1):
            if h.startswith(text[-k:]):
                text = text[:-k]
                break
    return text


class TextStream:
    """The text deltas of a growing list of token ids (``skip_special_tokens`` decoding)."""

    def __init__(self, tokenizer, holds: tuple[str, ...] = ()):
        self.tokenizer, self.holds = tokenizer, tuple(h for h in holds if h)
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; the new text that may be sent now ("" when none)."""
        self.ids += token_ids
        safe = safe_prefix(self.tokenizer.decode(self.ids, skip_special_tokens=True), self.holds)
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""
        delta, self.sent = safe[len(self.sent):], safe
        return delta

    def rest(self, final: str) -> str:
        """The delta that completes what was sent into ``final`` (the answer's whole content)."""
        if not final.startswith(self.sent):
            return ""
        delta, self.sent = final[len(self.sent):], final
        return delta
