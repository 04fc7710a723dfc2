"""How a conversation becomes token ids: the prompt, where a policy turn stops, and what follows it.

Environments speak text; the engine and the trainer see ids. The agent loop (`rose.ops.rollout`), the
provenance check (`rose.envs.provenance`) and the warm start (`rose.models.warmstart`) all build a
trajectory's ids through one `TurnFormat`, so the three agree token for token.

Ids are appended, never re-tokenized: a turn's generated ids go into the context as the engine made
them, and only new text (the environment's observation, the template's markup around it) is encoded.
Re-tokenizing the decoded conversation would not give the same ids (byte-level BPE merges across turn
boundaries, and a sampled token sequence is often not the canonical encoding of its text), so the
trainer would score tokens the engine never sampled.

- `PlainTurns`: a tokenizer without a chat template (the tiny word-level models). The prompt is BOS +
  the first observation; a turn stops on the newline token or EOS; observations follow as encoded.
- `ChatTurns`: a tokenizer with a chat template (real instruct models: Qwen2, Llama 3, ...). The prompt
  is the template's rendering of the first observation as a user message, with the generation prompt;
  a turn stops on the template's end-of-turn token (or EOS); each observation follows as the template's
  user message and the next generation prompt. A turn cut at `max_action_tokens` before its
  end-of-turn token gets one appended (not trained on), so the context stays a well-formed chat.
"""
from __future__ import annotations

from typing import Protocol

from rose.models.tokens import encode

# Stand-ins rendered through a chat template to find its markup around message contents.
_PROBE_USER, _PROBE_ASSISTANT, _PROBE_OBS = "rose-probe-user", "rose-probe-assistant", "rose-probe-observation"


class ChatTemplateError(ValueError):
    """A chat template ROSE cannot append to turn by turn (named in the message: what it does instead)."""


class TurnFormat(Protocol):
    stop_ids: tuple[int, ...]  # a policy turn ends after one of these tokens (it is kept)

    def prompt(self, text: str) -> list[int]:
        """Ids of the conversation's start, the environment's first observation."""

    def action(self, text: str) -> list[int]:
        """Ids of a policy turn that says `text`, stop token included (demonstrations: the warm start)."""

    def after(self, generated: list[int], observation: str, done: bool) -> list[int]:
        """Ids that follow a policy turn's `generated` ids: its closing if it was cut, then the
        environment's `observation` (and, unless `done`, the markup that opens the next policy turn)."""


class PlainTurns:
    """Text as is: BOS, the first observation, then policy turns and observations back to back."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.stop_ids = tuple(t for t in (tokenizer.convert_tokens_to_ids("\n"), tokenizer.eos_token_id)
                              if isinstance(t, int) and t != tokenizer.unk_token_id)
        self._bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []

    def prompt(self, text: str) -> list[int]:
        return self._bos + encode(self.tokenizer, text)

    def action(self, text: str) -> list[int]:
        return encode(self.tokenizer, text)  # plain demonstrations end their turns with the newline

    def after(self, generated: list[int], observation: str, done: bool) -> list[int]:
        return encode(self.tokenizer, observation)


class ChatTurns:
    """Turns in the tokenizer's chat template: user messages from the environment, assistant messages
    from the policy. The template's markup is found once, by rendering stand-in messages; each turn
    then costs one encode of its observation, as in plain text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

        def render(messages, generation_prompt: bool) -> str:
            try:
                return tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=generation_prompt)
            except Exception as e:  # a template that cannot render a plain two-role chat
                raise ChatTemplateError(f"the tokenizer's chat template cannot render a user/assistant chat: "
                                        f"{type(e).__name__}: {e}") from None

        def user(text):
            return {"role": "user", "content": text}

        chat = [user(_PROBE_USER), {"role": "assistant", "content": _PROBE_ASSISTANT}]
        closed = render(chat, False)
        end = closed.find(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT)
        if end < len(_PROBE_ASSISTANT):
            raise ChatTemplateError(f"the chat template does not render an assistant message's content as is: "
                                    f"{closed!r}")
        self.end_of_turn, self.eot_id = self._end_of_turn(closed[end:])
        self.stop_ids = tuple(dict.fromkeys(t for t in (self.eot_id, tokenizer.eos_token_id) if isinstance(t, int)))
        # The markup after a closed assistant turn around the next user message: before it and after it,
        # with the next generation prompt (the episode goes on) or without it (the episode ended).
        self._next = self._around(render(chat + [user(_PROBE_OBS)], True), closed, end)
        self._last = self._around(render(chat + [user(_PROBE_OBS)], False), closed, end)

    def _end_of_turn(self, closing: str) -> tuple[str, int]:
        """The special token that closes an assistant message (`closing`: the template's text right after
        one's content) and its id."""
        added = sorted(self.tokenizer.get_added_vocab().items(), key=lambda kv: -len(kv[0]))
        for text, token_id in added:
            if text and closing.startswith(text):
                return text, token_id
        raise ChatTemplateError(f"the chat template closes an assistant message with {closing!r}, which does not "
                                f"start with a special token; ROSE stops a policy turn on a token id")

    def _around(self, rendered: str, closed: str, end: int) -> tuple[str, str]:
        # Appending turn by turn is exact only if the template renders earlier turns the same whatever
        # follows (some templates rewrite history, e.g. drop earlier turns' reasoning).
        if rendered[:end] != closed[:end] or not rendered[end:].startswith(self.end_of_turn):
            raise ChatTemplateError(f"the chat template renders earlier turns differently once a turn follows "
                                    f"({closed[:end]!r} then {rendered[:end]!r}); ROSE appends turns as ids and "
                                    f"needs a template that leaves history as it is")
        pre, found, post = rendered[end + len(self.end_of_turn):].partition(_PROBE_OBS)
        if not found:
            raise ChatTemplateError(f"the chat template does not render a user message's content as is: {rendered!r}")
        return pre, post

    def prompt(self, text: str) -> list[int]:
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                      add_generation_prompt=True)
        return encode(self.tokenizer, rendered)

    def action(self, text: str) -> list[int]:
        # A plain demonstration's turn ends with a newline; in a chat the end-of-turn token ends it.
        return encode(self.tokenizer, text.rstrip("\n")) + [self.eot_id]

    def after(self, generated: list[int], observation: str, done: bool) -> list[int]:
        closing = [] if generated and generated[-1] in self.stop_ids else [self.eot_id]
        if done and not observation:
            return closing
        pre, post = self._last if done else self._next
        return closing + encode(self.tokenizer, pre + observation + post)


def turn_format(tokenizer) -> TurnFormat:
    """The tokenizer's turn format (kept on it: built once per tokenizer): `ChatTurns` when it has a chat
    template, `PlainTurns` otherwise."""
    fmt = tokenizer.__dict__.get("_rose_turns")
    if fmt is None:
        fmt = ChatTurns(tokenizer) if getattr(tokenizer, "chat_template", None) else PlainTurns(tokenizer)
        tokenizer.__dict__["_rose_turns"] = fmt
    return fmt
