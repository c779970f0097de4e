"""Token-in/token-out turns: only the new environment/tool text is ever tokenized.

A multi-turn sample's context is ``prompt_ids + response_ids`` exactly as the engine returned
them; the model's tokens are never decoded and re-encoded (a re-encoding can differ from the
sampled ids -- BPE merges across the boundary -- and the trainer would then score tokens the
engine never produced). After a model turn, the next turn's prefix is extended by the token ids
of the *delta* text the chat template renders for the new messages (a tool result, an
environment observation) plus the assistant header of the next turn.

The delta is found by rendering a reference conversation with and without the new messages:
``render([user, assistant "A"] + new, add_generation_prompt=True)`` must start with
``render([user, assistant "A"])`` -- the template is *prefix-preserving* for such turns (Qwen2.5's
is; Qwen3's, which drops earlier ``<think>`` blocks, is not for reasoning turns). ``ChatTurns``
checks this once at start-up and refuses clearly otherwise.

Boundary tokens: the template closes an assistant turn with ``<eos><suffix>`` (Qwen's
``<|im_end|>`` + ``\\n``). The engine stops *on* the eos token (it is the last model token) but
never produces the suffix; so the environment segment is ``suffix + delta``, or ``eos + suffix +
delta`` when the model turn ended without eos (stopped at ``</tool_call>`` or at its length).
"""

from __future__ import annotations

from rlvr.core.errors import ConfigError

_USER, _ANSWER = "U", "A"


class ChatTurns:
    """The environment-segment token ids of new chat messages, after a model turn."""

    def __init__(self, tokenizer, tools: list[dict] | None = None, chat_template_kwargs: dict | None = None,
                 probe_roles: tuple[str, ...] = ("tool", "user")):
        self.tokenizer, self.tools, self.kwargs = tokenizer, tools or None, dict(chat_template_kwargs or {})
        if getattr(tokenizer, "chat_template", None) is None:
            raise ConfigError("--apply-chat-template", "multi-turn rollouts need a tokenizer with a chat template")
        self.eos_text = tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id)
        self.eos_id = tokenizer.eos_token_id
        base = self.render([{"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER}], False)
        end = base.rfind(_ANSWER + self.eos_text)
        if end < 0:
            raise ConfigError("--apply-chat-template", f"the chat template does not close an assistant turn with the "
                                                       f"eos token {self.eos_text!r}; cannot find turn boundaries")
        self.suffix = base[end + len(_ANSWER + self.eos_text):]  # e.g. "\n" after <|im_end|>
        for role in probe_roles:
            self.delta_text([{"role": role, "content": "probe"}])  # raises if not prefix-preserving
        self.markers = self._markers()

    def _markers(self) -> tuple[str, ...]:
        """The template's user-turn header and assistant generation prompt (Qwen: ``<|im_start|>user``,
        ``<|im_start|>assistant``): text a message holds only when it was rendered already."""
        probe = "\x00"
        user = self.render([{"role": "user", "content": probe}], False)
        generation = self.render([{"role": "user", "content": probe}], True)[len(user):]
        head = user[: user.index(probe)]
        head = head[head.rfind(self.eos_text) + len(self.eos_text):] if self.eos_text in head else head
        return tuple(m.strip() for m in (head, generation) if m.strip())

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **self.kwargs)

    def prompt_ids(self, messages: list[dict]) -> tuple[str, list[int]]:
        """The first prompt: the messages rendered with the assistant header."""
        text = self.render(messages, True)
        return text, self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def delta_text(self, new_messages: list[dict]) -> str:
        """What the template adds after a closed assistant turn for ``new_messages`` plus the next
        assistant header; ConfigError when the template rewrites the earlier turns."""
        head = [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ANSWER}]
        base = self.render(head, False)
        full = self.render(head + list(new_messages), True)
        if not full.startswith(base):
            roles = sorted({m["role"] for m in new_messages})
            raise ConfigError("--apply-chat-template",
                              f"the chat template is not prefix-preserving for {roles} turns: rendering a new "
                              "message changes the text of the earlier turns, so turns cannot continue from the "
                              "engine's token ids (use a template that keeps earlier turns verbatim)")
        return full[len(base):]

    def observation_ids(self, new_messages: list[dict], last_model_ids: list[int]) -> tuple[str, list[int]]:
        """(text, ids) of the environment segment after a model turn whose tokens end with
        ``last_model_ids``: closes the turn (eos if missing, then the template's suffix), then the
        new messages and the next assistant header."""
        closed = bool(last_model_ids) and last_model_ids[-1] == self.eos_id
        text = ("" if closed else self.eos_text) + self.suffix + self.delta_text(new_messages)
        return text, self.encode(text)
