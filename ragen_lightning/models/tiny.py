"""The embedded tiny model: a small Qwen2-architecture causal LM and a tokenizer built from the
project's own text.

No model weights can be downloaded on the machines this project is built and tested on, so the
project carries its own model. It is built deterministically on first use and cached as an ordinary
Hugging Face folder (``save_pretrained``), so ``AutoModelForCausalLM``/``AutoTokenizer`` and vLLM
load it like any hub model.

Tokenizer: byte-level BPE trained on prompts and env renderings, with Qwen2's normaliser and split
pattern (a folder whose config says ``qwen2`` is re-loaded by transformers with Qwen2's tokenizer
class, which re-applies exactly that pre-tokenisation; training with anything else would change the
ids after a reload). Chat markers are special tokens;
``<think>``/``</think>``/``<answer>``/``</answer>`` are single, NON-special tokens so decoding with
``skip_special_tokens=True`` keeps them.

Grid cells (``TinySpec(grid_cells=True)``, an option; plain BPE stays the default until a measured
rung of the capacity ladder reads the map, docs/learning.md): the symbols every grid env declares in
its ``prompt_spec().symbols``, and the newline, are isolated while the BPE is trained, so no merge
contains one of them and every grid cell is exactly one token with a newline token between rows.
Plain BPE merged runs such as ``____`` and ``#_O``, so a cell's position was not a token position
and the 1.1M model never learned to read a map (issue 14; docs/learning.md, "Capacity ladder"). The
isolation is a property of the merges, not of the pre-tokenizer: the saved pre-tokenizer is Qwen2's
own, which is what transformers re-applies on reload, and with no merge spanning a grid symbol it
cannot join cells whatever pre-token they land in.

The cache key hashes the model spec and the training corpus, so a change to the env renderings or
prompt text builds a new folder instead of silently reusing a tokenizer trained on other text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ragen_lightning.models.cache import CACHE_ENV_VAR, build_folder, cache_root  # noqa: F401 - re-exported
from ragen_lightning.rollout import prompting
from ragen_lightning.rollout.env_packages import import_env_packages

PAD_TOKEN, BOS_MARK, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, BOS_MARK, EOS_TOKEN)
# Qwen-style chat template without an implicit default system message.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
_BUILD_VERSION = 1  # bump when the build recipe changes in a way the corpus hash does not see


@dataclass(frozen=True)
class TinySpec:
    """Architecture of the tiny model (defaults: ~1M parameters, fp32, fast on 2 CPU cores).

    Args:
        hidden_size: model width.
        num_layers: transformer blocks. num_heads: attention heads. num_kv_heads: key/value heads
        (grouped-query attention like Qwen2). intermediate_size: MLP width. vocab_size: BPE
        vocabulary target (the trained tokenizer may be smaller; the model uses its real size).
        max_position_embeddings: context length. seed: initialisation seed of the weights.
        grid_cells: one token per grid cell: the grid envs' symbols and the newline never merge with
        anything
            (False: plain byte-level BPE, which merges runs of grid symbols).
        qwen: Qwen2.5's own tokenizer and chat template (:mod:`ragen_lightning.models.qwen`, built
        offline) and
            Qwen2.5's 151,936-row vocabulary instead of the trained BPE: a stand-in shaped like Qwen2.5 on the token
            side (random weights), for exercising the pipeline with the real tokenizer
            (``tiny:qwen``).
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 512
    vocab_size: int = 1024
    max_position_embeddings: int = 4096
    seed: int = 0
    grid_cells: bool = False
    qwen: bool = False


# Qwen2.5's config.json vocab_size: the tokenizer's 151,665 ids padded for the kernels
QWEN_VOCAB_SIZE = 151936
# recorded in the cache key only when on (older keys stay valid)
_LATER_OPTIONS = ("grid_cells", "qwen")


# Named sizes of the capacity ladder (docs/learning.md): parameters, fp32 forward+backward tokens/s
# (batch 4 x 512, one thread, idle 2-core machine). Combine with grid_cells:
# ``dataclasses.replace(PRESETS["small"], grid_cells=True)``.
PRESETS: dict[str, TinySpec] = {
    "tiny": TinySpec(),  # 1.03M parameters, 8.5k tokens/s
    # 3.32M, 2.7k
    "small": TinySpec(
        hidden_size=192, num_layers=6, num_heads=6, num_kv_heads=2, intermediate_size=768
    ),
    # 4.03M, 2.7k
    "wide": TinySpec(
        hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=1024
    ),
}


def spec_from_name(name: str) -> TinySpec:
    """The spec a model name selects: ``"tiny"`` (the default preset, BPE), ``"tiny:cells"`` (one
    token per grid cell), ``"tiny:small"``, ``"tiny:small+cells"``, ... (``tiny:`` then ``+``-joined
    options: at most one preset of :data:`PRESETS` and ``cells``). Raises ``ValueError`` naming the
    allowed options."""
    if name == "tiny":
        return PRESETS["tiny"]
    head, _, options = name.partition(":")
    parts = options.split("+") if options else []
    presets = [p for p in parts if p in PRESETS]
    unknown = [p for p in parts if p not in PRESETS and p not in ("cells", "qwen")]
    if (
        head != "tiny"
        or not parts
        or unknown
        or len(presets) > 1
        or len(parts) != len(set(parts))
        or {"cells", "qwen"} <= set(parts)
    ):
        raise ValueError(
            f"model {name!r}: the embedded model is 'tiny' or 'tiny:' followed by '+'-joined options, at "
            f"most one preset of {sorted(PRESETS)} and one of 'cells' (one token per grid cell) or 'qwen' "
            "(Qwen2.5's tokenizer) (e.g. 'tiny:cells', 'tiny:small+cells', 'tiny:qwen')"
        )
    return replace(
        PRESETS[presets[0] if presets else "tiny"],
        grid_cells="cells" in parts,
        qwen="qwen" in parts,
    )


# The envs whose texts the tokenizer is trained on, frozen: the corpus is part of every tiny model's
# cache key, so an env added to the package must not change it (it would rebuild every cached tiny
# model and warm start and shift every figure measured on them). An env that is not listed tokenizes
# through the byte-level BPE all the same (its words are spelled from the merges learned on these
# texts). Extending the list is a new tokenizer version.
CORPUS_ENV_IDS: tuple[str, ...] = (
    "ragen/Sokoban-v0",
    "ragen/SimpleSokoban-v0",
    "ragen/LargerSokoban-v0",
    "ragen/CoordSokoban-v0",
    "ragen/SokobanDifferentGridVocab-v0",
    "ragen/FrozenLake-v0",
    "ragen/CoordFrozenLake-v0",
    "ragen/Bandit-v0",
    "ragen/BanditTest-v0",
    "ragen/Countdown-v0",
    "ragen/MetaMathQA-v0",
    "ragen/Sudoku-v0",
    "ragen/2048-v0",
    "ragen/RubiksCube-v0",
)


def _import_env_packages() -> None:
    """Import the installed env packages
    (:func:`~ragen_lightning.rollout.env_packages.import_env_packages`, found by entry point), so
    the corpus ids resolve; a package that cannot be imported contributes no ids."""
    try:
        import_env_packages()
    except ImportError:
        pass


def corpus_env_ids() -> list[str]:
    """The ids of :data:`CORPUS_ENV_IDS` that are registered once the installed env packages are
    imported, in that order. Ids registered beyond the list (a user's or a test's env) never change
    the tiny model."""
    import gymnasium as gym

    _import_env_packages()
    return [env_id for env_id in CORPUS_ENV_IDS if env_id in gym.registry]


def default_corpus(
    env_ids: Sequence[str] | None = None, seeds: int = 24, steps: int = 4
) -> list[str]:
    """Text the tokenizer is trained on: prompts, turn blocks, tagged answers and env renderings.

    ``env_ids`` defaults to :func:`corpus_env_ids`. Each env is reset on ``seeds`` seeds and stepped
    ``steps`` times with actions drawn from its own seeded action space, so the corpus is
    deterministic. An id whose texts repeat an earlier id's exactly (an alias such as
    ``ragen/Sokoban-v0`` and ``ragen/SimpleSokoban-v0``) adds nothing.
    """
    _import_env_packages()
    texts: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for env_id in corpus_env_ids() if env_ids is None else env_ids:
        env_texts = _env_texts(env_id, seeds, steps)
        if env_texts is None or tuple(env_texts) in seen:
            continue
        seen.add(tuple(env_texts))
        texts.extend(env_texts)
    # numbers and punctuation in many forms, so digits and rewards tokenise compactly
    texts.append(" ".join(str(i) for i in range(-20, 200)))
    texts.append(" ".join(f"{i / 10:.1f}" for i in range(-30, 120)))
    texts.append(
        prompting.INVALID_ACTION_WARNING
        + prompting.format_prompt(True)
        + prompting.format_prompt(False)
    )
    return texts


def _env_texts(env_id: str, seeds: int, steps: int) -> list[str] | None:
    """System prompt, turn blocks, tagged answers and reward lines of a few seeded random episodes
    of ``env_id``."""
    import gymnasium as gym

    try:
        env = gym.make(env_id)
    except (ImportError, ModuleNotFoundError, gym.error.Error, AttributeError):
        return None
    texts: list[str] = []
    core = env.unwrapped
    spec = core.prompt_spec()
    texts.append(prompting.system_prompt(spec, max_actions_per_episode=10))
    for seed in range(seeds):
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        names = tuple(getattr(core, "action_names", ()) or ())
        for turn in range(1, steps + 1):
            instruction = prompting.instruction_line(10 - turn, max_response_tokens=100)
            texts.append(prompting.turn_block(turn, obs, instruction))
            action = env.action_space.sample()
            if names:
                word = names[int(action) % len(names)]
                texts.append(
                    f"<think>I should go {word}.</think><answer>{word} || {names[0]}</answer>"
                )
            else:
                texts.append(f"<think>The answer is {action}.</think><answer>{action}</answer>")
            obs, reward, terminated, truncated, _ = env.step(action)
            texts.append(prompting.reward_text(reward))
            if terminated or truncated:
                break
    env.close()
    return texts


def grid_symbols(env_ids: Sequence[str] | None = None) -> str:
    """The characters of every grid env's ``prompt_spec().symbols`` (sorted, deduplicated) plus the
    newline; ``env_ids`` defaults to :func:`corpus_env_ids`."""
    import gymnasium as gym

    _import_env_packages()
    chars = {"\n"}
    for env_id in corpus_env_ids() if env_ids is None else env_ids:
        try:
            env = gym.make(env_id)
        except (ImportError, ModuleNotFoundError, gym.error.Error, AttributeError):
            continue
        for symbol, _meaning in env.unwrapped.prompt_spec().symbols:
            chars.update(symbol)
        env.close()
    return "".join(sorted(chars))


def build_tokenizer(corpus: Iterable[str], vocab_size: int = 1024, isolate: str = ""):
    """Train the byte-level BPE tokenizer and wrap it as a transformers fast tokenizer with the chat
    template.

    ``isolate``: characters that never merge with anything (each is a one-character pre-token while
    training, so no learned merge spans one; a multi-byte character still merges its own bytes into
    one token). Raises ValueError when one of them does not end up as exactly one token.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    qwen2_split = [
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    if isolate:
        char_class = "".join("\\" + c if c in "\\]^-[" else c for c in sorted(set(isolate)))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(f"[{char_class}]"), behavior="isolated", invert=False),
                *qwen2_split,
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence(qwen2_split)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # a rare multi-byte symbol (the box on target) would otherwise lose the race for the last merges
    multibyte = [c * 1000 for c in sorted(set(isolate)) if len(c.encode()) > 1]
    tok.train_from_iterator([*corpus, *multibyte], trainer=trainer)
    # save exactly the pre-tokenizer transformers re-applies to a qwen2 folder, so ids survive a
    # reload
    tok.pre_tokenizer = pre_tokenizers.Sequence(qwen2_split)
    split = [c for c in sorted(set(isolate)) if len(tok.encode(c + c + "a" + c).ids) != 4]
    if split:
        raise ValueError(f"grid symbols {split!r} are not one token each (too rare in the corpus?)")
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in prompting.TAG_TOKENS])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        additional_special_tokens=[BOS_MARK],
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
    )
    return wrapped


def build_model(spec: TinySpec, tokenizer):
    """A randomly initialised Qwen2 causal LM sized by ``spec`` (fp32), seeded by ``spec.seed``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=QWEN_VOCAB_SIZE if spec.qwen else len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        bos_token_id=None,
        dtype="float32",
    )
    devices = []  # fork the global RNG so building never perturbs the caller's random stream
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(spec.seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    return model


def _meta(spec: TinySpec, isolate: str) -> dict:
    """What the cache key and ``ragen_tiny.json`` record. An option added later is recorded only
    when on, so the builds from before it existed keep their cached folders (and the warm starts
    keyed on their names)."""
    meta = {
        "spec": {k: v for k, v in asdict(spec).items() if k not in _LATER_OPTIONS or v},
        "version": _BUILD_VERSION,
    }
    if spec.grid_cells:
        meta["isolate"] = isolate
    if spec.qwen:
        from ragen_lightning.models import qwen

        meta["tokenizer"] = qwen.cache_key()
    return meta


def _key(spec: TinySpec, corpus: Sequence[str], isolate: str) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(_meta(spec, isolate), sort_keys=True).encode())
    for text in corpus:
        h.update(text.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()[:16]


def tiny_model_path(
    spec: TinySpec | None = None,
    *,
    cache_dir: str | Path | None = None,
    corpus: Sequence[str] | None = None,
) -> Path:
    """Path of the cached tiny model folder, building it first if needed.

    The folder is written to a temporary directory and renamed into place, so an interrupted build
    never leaves a half-written model behind, and concurrent builders (e.g. two DDP ranks) end with
    the same folder.
    """
    spec = spec or TinySpec()
    # qwen: no BPE trained
    corpus = [] if spec.qwen else list(corpus) if corpus is not None else default_corpus()
    isolate = grid_symbols() if spec.grid_cells else ""
    root = Path(cache_dir) if cache_dir is not None else cache_root()
    final = root / f"tiny-{_key(spec, corpus, isolate)}"
    if (final / "config.json").is_file() and (final / "tokenizer.json").is_file():
        return final

    def write(tmp: Path) -> None:
        if spec.qwen:
            from ragen_lightning.models.qwen import qwen25_tokenizer

            tokenizer = qwen25_tokenizer(root)
        else:
            tokenizer = build_tokenizer(corpus, spec.vocab_size, isolate)
        build_model(spec, tokenizer).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "ragen_tiny.json").write_text(json.dumps(_meta(spec, isolate)))

    return build_folder(final, write, "config.json")
