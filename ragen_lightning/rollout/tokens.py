"""Token-in/token-out conversations: the exact ids the model was given and sampled, with the loss mask.

A trajectory is built incrementally from token ids, never by re-tokenising sampled text:

    ids = [chat(system, user_1) + "<think>"]  [sampled_1]  [glue + user_2 + "<think>"]  [sampled_2] ...
    mask        0 ... 0                       1 ... 1      0 ... 0                       1 ... 1

The "glue" is whatever the chat template puts between an assistant message's content and the next user message
(for Qwen-style templates ``<|im_end|>\\n``; when the model already sampled the end-of-turn token only the rest of
it). It is derived once from the template itself by rendering probe conversations, so any chat template works
without per-model special cases (RAGEN recovers masks from ``<|im_start|>`` parity and supports Qwen and Llama-3
only).

Sampled ids are kept verbatim, so the tokens trained on are the tokens whose log-probs the engine reported. The
price is that re-rendering the decoded conversation through the template may give other ids (a model can sample a
non-canonical split of a word); :meth:`ChatTokens.drift` measures exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ragen_lightning.rollout.prompting import generation_prefix
from ragen_lightning.types import Conversation

_PROBE_SYS, _PROBE_USER, _PROBE_ASSISTANT, _PROBE_NEXT = (
    "\x01S\x01",
    "\x01U\x01",
    "\x01A\x01",
    "\x01V\x01",
)


class ChatTokens:
    """Builds :class:`Conversation` token streams with a tokenizer's chat template.

    Args:
        tokenizer: a transformers tokenizer with a chat template and an end-of-turn (eos) token.
        enable_think: prime each assistant turn with ``<think>`` (else ``<answer>``, or nothing with
        ``tools``). tools: the tool-call action format: the chat template's ``tools`` list (rendered
        into the first prompt and
            every re-rendering); the env's results then come back as ``tool`` messages (:meth:`tool_ids`). The
            template must render tools and tool messages append-only, else ``ValueError``.
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        enable_think: bool = True,
        tools: Sequence[dict[str, Any]] | None = None,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no chat template"
            )
        self.tokenizer = tokenizer
        self.enable_think = enable_think
        self.tools = list(tools) if tools is not None else None
        self.prefix = generation_prefix(enable_think, tool_calls=self.tools is not None)
        self.eos_id = tokenizer.eos_token_id
        self.eos_text = tokenizer.eos_token
        if self.eos_id is None:
            raise ValueError(
                "tokenizer has no eos (end-of-turn) token; generation could never stop a turn"
            )
        self._glue_after_eos, self._glue_no_eos, self._user_before, self._user_after = (
            self._probe_template()
        )
        self._tool_glue = self._probe_tools() if self.tools is not None else None
        self.prefix_ids = self.encode(self.prefix)

    def with_tools(self, tools: Sequence[dict[str, Any]]) -> ChatTokens:
        """This builder for the tool-call action format with ``tools`` (same tokenizer and thinking
        setting)."""
        return ChatTokens(self.tokenizer, enable_think=self.enable_think, tools=tools)

    # -- template probing --------------------------------------------------------------------------
    def _render(
        self, messages: list[dict[str, str]], add_generation_prompt: bool, tools: Any = None
    ) -> str:
        return self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=False, tools=tools
        )

    def _probe_template(self) -> tuple[str, str, str, str]:
        base = [{"role": "system", "content": _PROBE_SYS}, {"role": "user", "content": _PROBE_USER}]
        with_assistant = base + [{"role": "assistant", "content": _PROBE_ASSISTANT}]
        with_next = with_assistant + [{"role": "user", "content": _PROBE_NEXT}]
        a = self._render(with_assistant, False)
        b = self._render(with_next, True)
        if not b.startswith(a) or _PROBE_ASSISTANT not in a or _PROBE_NEXT not in b:
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its continuation; "
                "token-in/token-out needs an append-only template"
            )
        # e.g. "<|im_end|>\n"
        after_assistant = a[a.index(_PROBE_ASSISTANT) + len(_PROBE_ASSISTANT) :]
        delta = b[len(a) :]  # e.g. "<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n"
        user_before, user_after = delta.split(_PROBE_NEXT)
        glue_after_eos = (
            after_assistant[len(self.eos_text) :]
            if after_assistant.startswith(self.eos_text)
            else None
        )
        if glue_after_eos is None:
            raise ValueError(
                f"the chat template does not close an assistant message with the eos token {self.eos_text!r}"
            )
        return glue_after_eos, after_assistant, user_before, user_after

    def _probe_tools(self) -> tuple[str, str, str]:
        """``(before, between, after)`` of tool messages following an assistant message: N results
        render as ``before + r1 + between + r2 ... + rN + after`` (after includes the next assistant
        header). Checks that the template renders the tools at all and appends tool messages without
        rewriting what came before."""
        name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
        base = [{"role": "system", "content": _PROBE_SYS}, {"role": "user", "content": _PROBE_USER}]
        if self._render(base, True, self.tools) == self._render(base, True):
            raise ValueError(
                f"the chat template of {name!r} ignores tools=...: the tool-call action format "
                "(--data.episode.action_format tool_call) needs a template that offers tools, e.g. "
                "Qwen2.5's (--model.model tiny:qwen, or a Qwen2.5 model)"
            )
        a = self._render(base + [{"role": "assistant", "content": _PROBE_ASSISTANT}], False)
        results = ["\x01R\x01", "\x01Q\x01", "\x01W\x01"]
        deltas = []
        for n in (1, 2, 3):
            b = self._render(
                base
                + [{"role": "assistant", "content": _PROBE_ASSISTANT}]
                + [{"role": "tool", "content": r} for r in results[:n]],
                True,
            )
            if not b.startswith(a):
                raise ValueError(
                    f"the chat template of {name!r} does not append tool messages to the conversation "
                    "(it rewrites earlier text); token-in/token-out needs an append-only template"
                )
            deltas.append(b[len(a) :])
        before, after = deltas[0].split(results[0])
        between = deltas[1][len(before) + len(results[0]) : deltas[1].index(results[1])]
        if any(d != before + between.join(results[:n]) + after for n, d in zip((1, 2, 3), deltas)):
            raise ValueError(
                f"the chat template of {name!r} renders consecutive tool messages inconsistently"
            )
        return before, between, after

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    # -- building ----------------------------------------------------------------------------------
    def start(self, system: str, user: str) -> Conversation:
        """A new conversation: system + first user message + assistant header + generation
        prefix."""
        conv = Conversation(
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}]
        )
        ids = self.tokenizer.apply_chat_template(
            conv.messages,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            tools=self.tools,
        )
        conv.extend(list(ids) + self.prefix_ids, sampled=False)
        return conv

    def add_response(
        self,
        conv: Conversation,
        sampled_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        *,
        trainable: bool = True,
    ) -> str:
        """Append one assistant turn's sampled ids; returns the decoded text without the prefix.

        ``trainable=False`` replays an earlier turn as context (mask 0, no turn span), as windowed
        context modes do.
        """
        sampled_ids = list(sampled_ids)
        start = len(conv)
        conv.extend(sampled_ids, sampled=trainable, logprobs=logprobs if trainable else None)
        if trainable:
            conv.turn_spans.append((start, len(conv)))
        conv.ended_with_eos = bool(sampled_ids) and sampled_ids[-1] == self.eos_id
        body = sampled_ids[:-1] if conv.ended_with_eos else sampled_ids
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        conv.messages.append({"role": "assistant", "content": self.prefix + text})
        return text

    def next_user_ids(self, conv: Conversation, user: str) -> list[int]:
        """Ids that :meth:`add_user` would append (used to check the context budget before
        appending)."""
        glue = self._glue_after_eos if conv.ended_with_eos else self._glue_no_eos
        return self.encode(glue + self._user_before + user + self._user_after) + self.prefix_ids

    def add_user(self, conv: Conversation, user: str) -> None:
        """Close the assistant turn (template glue) and append the next user message + generation
        prefix."""
        conv.extend(self.next_user_ids(conv, user), sampled=False)
        conv.messages.append({"role": "user", "content": user})

    def tool_ids(self, conv: Conversation, results: Sequence[str]) -> list[int]:
        """Ids that :meth:`add_tools` would append: the assistant turn closed, one tool message per
        result, the next assistant header and the generation prefix."""
        if self._tool_glue is None:
            raise ValueError(
                "tool messages need a ChatTokens built with tools (ChatTokens.with_tools)"
            )
        if not results:
            raise ValueError("tool messages need at least one result")
        before, between, after = self._tool_glue
        glue = self._glue_after_eos if conv.ended_with_eos else self._glue_no_eos
        return self.encode(glue + before + between.join(results) + after) + self.prefix_ids

    def add_tools(self, conv: Conversation, results: Sequence[str]) -> None:
        """Close the assistant turn and append one ``tool`` message per result (the env's answers to
        its calls)."""
        conv.extend(self.tool_ids(conv, results), sampled=False)
        conv.messages.extend({"role": "tool", "content": r} for r in results)

    def next_message_ids(self, conv: Conversation, message: str | Sequence[str]) -> list[int]:
        """:meth:`next_user_ids` of a user message (a string) or :meth:`tool_ids` of tool results (a
        sequence)."""
        return (
            self.next_user_ids(conv, message)
            if isinstance(message, str)
            else self.tool_ids(conv, message)
        )

    def add_message(self, conv: Conversation, message: str | Sequence[str]) -> None:
        """:meth:`add_user` of a user message (a string) or :meth:`add_tools` of tool results (a
        sequence)."""
        if isinstance(message, str):
            self.add_user(conv, message)
        else:
            self.add_tools(conv, message)

    # -- checks ------------------------------------------------------------------------------------
    def retokenize(self, conv: Conversation) -> list[int]:
        """Ids of the conversation's messages rendered by the chat template, cut where the stored
        ids end."""
        follows_user = conv.messages[-1]["role"] in ("user", "tool")
        ids = self.tokenizer.apply_chat_template(
            conv.messages,
            add_generation_prompt=follows_user,
            tokenize=True,
            return_dict=False,
            tools=self.tools,
        )
        ids = list(ids)
        if follows_user:
            ids += self.prefix_ids
        elif not conv.ended_with_eos:
            # the template closes the last assistant message with eos + glue; the stored stream
            # stops before it
            ids = ids[: len(ids) - len(self.encode(self._glue_no_eos))]
        else:
            ids = ids[: len(ids) - len(self.encode(self._glue_after_eos))]
        return ids

    def drift(self, conv: Conversation) -> bool:
        """True when re-rendering the messages does not reproduce the stored ids."""
        return self.retokenize(conv) != conv.input_ids
