"""An engine behind any OpenAI-compatible chat-completions endpoint (hosted models, a local vLLM or
llama.cpp server).

It implements the :class:`~ragen_lightning.rollout.engine.GenerationEngine` protocol so that the
rollout runner puts an API model into the same environments, prompts, parsing and seeds as a trained
checkpoint (RAGEN's ``base_llm.py`` does this for OpenAI / Anthropic / Together / DeepSeek). Unlike
the HF and vLLM engines it is **text in, text out**: it sends each prompt's chat messages (the
runner passes them because ``needs_messages`` is True) and gets text back. The token ids it returns
are that text re-encoded with the local tokenizer (so the runner's conversation, length budget and
parsing work unchanged); they are not what the remote model sampled and carry no log-probs, so the
runner marks the trajectories ``trainable = False`` and
:func:`~ragen_lightning.data.batching.build_batch` refuses them. Evaluation only.

Requests run concurrently (``max_concurrency`` at a time, one pooled ``httpx`` client). A request
that fails with HTTP 429, a 5xx status, a connection error, a timeout, or an HTTP 200 whose body is
unusable (not JSON, no ``choices[0].message``, content that is not text: a proxy's error page, a
truncated answer) is retried up to ``max_retries`` times, waiting what the server's ``Retry-After``
header asks, else ``backoff_s * 2**attempt`` (capped at ``max_backoff_s``, jittered by up to +25 %
so concurrent requests do not retry in step); when they run out,
:class:`APIError` says why in one line, naming the endpoint (and quoting the first 200 characters of an unusable
body). Any other failure (a 4xx) raises :class:`APIError` at once. The key is read from the
environment variable ``api_key_env`` (never from a file or a flag, so it does not end up in configs
or logs); a local server usually needs none.
"""

from __future__ import annotations

import email.utils
import math
import os
import random
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ragen_lightning.rollout.engine import Generation, SamplingParams, check_requests

# longest wait honoured from a Retry-After header (a misconfigured server must not park the
# evaluation for a day)
MAX_RETRY_AFTER_S = 600.0


class APIError(RuntimeError):
    """A chat-completions request failed for good; the message names the endpoint and why."""


class _UnusableBody(ValueError):
    """An HTTP 200 answer whose body is not a chat completion (retried like a 5xx); the message says
    what is wrong and quotes the body's first 200 characters."""


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date; None when
    absent or unreadable."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


class APIEngine:
    """Chat completions from an OpenAI-compatible endpoint (module docstring).

    Args:
        model: the model name the endpoint serves (``gpt-4o-mini``, the ``--served-model-name`` of a vLLM server...).
        tokenizer: a local tokenizer: the returned text is re-encoded with it for the runner's
        conversation (the
            embedded tiny model's byte-level tokenizer encodes any text).
        base_url: the API root; requests go to ``<base_url>/chat/completions``. api_key_env:
        environment variable holding the key, sent as ``Authorization: Bearer``; unset: no header.
        max_concurrency: requests in flight at most. max_retries: retries of one request after a
        429, 5xx, connection error, timeout or unusable HTTP 200
            body (0: none).
        timeout_s: seconds to connect, and between bytes of the response, before a request counts as
        timed out. backoff_s: first wait before a retry when the server sends no ``Retry-After``;
        doubles every retry. max_backoff_s: longest such wait. prefix: the generation prefix the
        runner primes every assistant turn with (``<think>``); an API turn cannot
            be primed, so a response that starts with it has it removed (the runner adds it back in the messages).
        extra_body: further JSON fields of every request (``{"top_k": 20}`` for a vLLM server, ...).
    """

    needs_messages = True  # the runner passes each prompt's chat messages
    trainable = False  # re-encoded text, no sampled log-probs: evaluation only

    def __init__(
        self,
        model: str,
        tokenizer: Any,
        *,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str = "OPENAI_API_KEY",
        max_concurrency: int = 8,
        max_retries: int = 5,
        timeout_s: float = 60.0,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        prefix: str = "<think>",
        extra_body: dict[str, Any] | None = None,
    ):
        import httpx

        if not model:
            raise ValueError("APIEngine needs the model name the endpoint serves")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        if (
            max_concurrency < 1
            or max_retries < 0
            or timeout_s <= 0
            or backoff_s < 0
            or max_backoff_s < backoff_s
        ):
            raise ValueError(
                f"APIEngine needs max_concurrency >= 1, max_retries >= 0, timeout_s > 0 and "
                f"0 <= backoff_s <= max_backoff_s; got {max_concurrency}, {max_retries}, {timeout_s}, "
                f"{backoff_s}, {max_backoff_s}"
            )
        self.model, self.tokenizer = model, tokenizer
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key_env = api_key_env
        self.max_concurrency, self.max_retries = max_concurrency, max_retries
        self.timeout_s, self.backoff_s, self.max_backoff_s = timeout_s, backoff_s, max_backoff_s
        self.prefix, self.extra_body = prefix, dict(extra_body or {})
        self.eos_id = tokenizer.eos_token_id
        key = os.environ.get(api_key_env) if api_key_env else None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._has_key = bool(key)
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(max_connections=max_concurrency),
        )
        self._sleep = time.sleep  # tests record the waits instead of sleeping
        self._lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "completion_tokens": 0}

    # -- the engine protocol -----------------------------------------------------------------------
    def sync_weights(self) -> None:  # the remote model's weights are not ours to sync
        return None

    def close(self) -> None:
        self._client.close()

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        seeds: Sequence[int] | None = None,
        messages: Sequence[Sequence[dict[str, str]]] | None = None,
    ) -> list[Generation]:
        """One chat completion per prompt, from its chat ``messages`` (the token ids ``prompts`` are
        only checked: the endpoint applies its own chat template). Raises :class:`APIError` when a
        request fails for good."""
        check_requests(prompts, seeds)
        if messages is None or len(messages) != len(prompts):
            raise ValueError(
                "APIEngine is text-in/text-out: it needs the chat messages of every prompt (the rollout "
                "runner passes them to engines with needs_messages = True)"
            )
        payloads = [
            self.payload(m, params, None if seeds is None else seeds[i])
            for i, m in enumerate(messages)
        ]
        if len(payloads) == 1:
            return [self._complete(payloads[0])]
        pool = ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(payloads)))
        try:
            return list(pool.map(self._complete, payloads))
        # on a failure, requests not yet started are dropped; running ones end within their timeout
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- requests ----------------------------------------------------------------------------------
    def payload(
        self, messages: Sequence[dict[str, str]], params: SamplingParams, seed: int | None
    ) -> dict[str, Any]:
        """The JSON body of one request: the messages, the turn's length cap and sampling settings
        (temperature 0 is greedy; a seed is sent with sampled requests, which endpoints that support
        it use to repeat a sample)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [dict(m) for m in messages],
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
        }
        if params.top_p < 1.0:
            body["top_p"] = params.top_p
        if params.top_k is not None and params.top_k > 0:
            body["top_k"] = params.top_k  # not in OpenAI's API; vLLM and llama.cpp servers take it
        if seed is not None and params.temperature > 0:
            body["seed"] = int(seed) % 2**31
        # the episode's stop strings (``--data.episode.stop``), as the other engines take them
        if params.stop:
            body["stop"] = list(params.stop)
        body.update(self.extra_body)
        return body

    def _complete(self, payload: dict[str, Any]) -> Generation:
        text, finish = self._request(payload)
        if self.prefix and text.lstrip().startswith(self.prefix):
            text = text.lstrip()[len(self.prefix) :]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        if finish == "stop":
            ids.append(self.eos_id)
        return Generation(ids, [0.0] * len(ids), finish)

    def _request(self, payload: dict[str, Any]) -> tuple[str, str]:
        """``(content, "stop" | "length")`` of one request, with retries (module docstring)."""
        import httpx

        for attempt in range(self.max_retries + 1):
            retry_after = None
            with self._lock:
                self.stats["requests"] += 1
                self.stats["retries"] += attempt > 0
            try:
                response = self._client.post(self.url, json=payload)
            except httpx.TimeoutException:
                reason = f"timed out (timeout_s={self.timeout_s})"
            except httpx.TransportError as e:
                reason = f"connection error ({type(e).__name__}: {e})"
            else:
                status = response.status_code
                if status == 200:
                    try:
                        return self._parse(response)
                    except _UnusableBody as e:
                        reason = f"HTTP 200 with {e}"
                elif status != 429 and status < 500:
                    raise APIError(
                        f"{self.url}: HTTP {status}: {response.text[:300]!r}{self._key_hint(status)}"
                    )
                else:
                    reason, retry_after = (
                        f"HTTP {status}",
                        parse_retry_after(response.headers.get("retry-after")),
                    )
            if attempt == self.max_retries:
                raise APIError(
                    f"{self.url}: {reason}; gave up after {attempt + 1} attempt(s) "
                    f"(max_retries={self.max_retries})"
                )
            if retry_after is None:
                retry_after = min(self.backoff_s * 2**attempt, self.max_backoff_s) * (
                    1 + 0.25 * random.random()
                )
            self._sleep(retry_after)
        raise AssertionError("unreachable")

    def _key_hint(self, status: int) -> str:
        if status not in (401, 403):
            return ""
        state = "is set" if self._has_key else "is not set"
        return f" (the key is read from ${self.api_key_env}, which {state})"

    def _parse(self, response) -> tuple[str, str]:
        try:
            data = response.json()
        except ValueError:
            raise _UnusableBody(f"a body that is not JSON: {response.text[:200]!r}") from None
        try:
            choice = data["choices"][0]
            content = choice["message"].get("content")
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise _UnusableBody(
                f"a body without choices[0].message: {response.text[:200]!r}"
            ) from None
        if content is not None and not isinstance(content, str):
            raise _UnusableBody(
                f"choices[0].message.content that is not text: {response.text[:200]!r}"
            )
        usage = data.get("usage") if isinstance(data, dict) else None
        if isinstance(usage, dict):
            with self._lock:
                for key in ("prompt_tokens", "completion_tokens"):
                    if isinstance(usage.get(key), int):
                        self.stats[key] += usage[key]
        return content or "", "length" if finish == "length" else "stop"
