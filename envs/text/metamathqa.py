"""Static question answering over a local file (RAGEN's ``metamathqa`` env and its unregistered
``static`` sibling).

RAGEN streams the HF ``meta-math/MetaMathQA`` train split. Nothing is downloaded here: the env reads
a local ``.jsonl`` or ``.parquet`` file, either in MetaMathQA's own schema (``query``/``response``;
the label is what follows ``The answer is: `` on the response's last line) or a plain
``question``/``answer`` schema. Without a path it uses ``envs/text/data/arithmetic_qa.jsonl``, a
small set of arithmetic word problems written in MetaMathQA's schema by
:func:`generate_arithmetic_qa` (a test checks the shipped file equals the generator's output).

Departures from RAGEN: numbers also match when equal as exact rationals (``"12.0"`` == ``"12"``),
and ``max_attempts`` bounds an episode (RAGEN relies on the agent's action budget alone).
"""

from __future__ import annotations

import functools
import json
import os
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

from envs.base import PromptSpec, TextEnv, bounded_int, text_space

INSTRUCTION = "You are solving Math problems. "
DEFAULT_PATH = Path(__file__).parent / "data" / "arithmetic_qa.jsonl"
LABEL_PATTERN = re.compile(r"The answer is: (.*?)$")
CORRECT_TEXT = "Correct!"
INCORRECT_TEXT = "Incorrect. Please think again."
MAX_ANSWER_LENGTH = 1024


# --------------------------------------------------------------------------------------------------
# Answer matching
# --------------------------------------------------------------------------------------------------

_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(,\d{3})+(\.\d*)?$")
# The syntax ``fractions.Fraction`` accepts (after whitespace removal): sign, digits with optional
# ``_`` groups, then either ``/denominator`` or an optional decimal part and exponent. Digit runs
# are split by ``_``, ``/``, ``.`` or ``e``, so the pattern is unambiguous and matching is linear in
# the length.
_NUMERAL = re.compile(
    r"[-+]?(?=\d|\.\d)\d*(?:_\d+)*"
    r"(?:/\d+(?:_\d+)*|(?:\.\d*(?:_\d+)*)?(?:e(?P<exp>[-+]?\d+(?:_\d+)*))?)",
    re.IGNORECASE,
)
# Bounds that keep judging a number cheap: ``Fraction("1e999999999")`` computes 10**999999999
# (minutes, gigabytes). A numeral beyond them is never equal to another number; it still matches an
# identical string.
MAX_NUMERAL_LENGTH = 200
MAX_EXPONENT = 1000


def normalize_answer(text: str) -> str:
    """RAGEN's normal form: all whitespace removed, lower case."""
    return "".join(text.split()).lower()


def _numeral(text: str) -> tuple[str, bool] | None:
    """``(numeral without thousands separators, within bounds)``, or None when ``text`` is not a
    numeral."""
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    m = _NUMERAL.fullmatch(text)
    if m is None:
        return None
    exp = m.group("exp")
    # the exponent's digits are bounded by the length check before int() reads them
    ok = len(text) <= MAX_NUMERAL_LENGTH and (
        exp is None or abs(int(exp.replace("_", ""))) <= MAX_EXPONENT
    )
    return text, ok


def numeral_out_of_range(text: str) -> bool:
    """True when ``text`` (whitespace removed) is a numeral beyond :data:`MAX_NUMERAL_LENGTH`
    characters or an exponent of magnitude :data:`MAX_EXPONENT`: such a number is only ever matched
    as a string."""
    parsed = _numeral(normalize_answer(text))
    return parsed is not None and not parsed[1]


def _as_number(text: str) -> Fraction | None:
    parsed = _numeral(text)
    if parsed is None or not parsed[1]:
        return None
    try:
        return Fraction(parsed[0])
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def answers_match(answer: str, label: str) -> bool:
    """True when the normalised strings are equal, or both parse as the same exact number.

    Numbers: integers, decimals, fractions ``a/b``, scientific notation and thousands separators
    (``"1,000"``); ``"12.0"``, ``"12"`` and ``"24/2"`` all match ``"12"``. A numeral longer than
    :data:`MAX_NUMERAL_LENGTH` characters or with an exponent beyond +-:data:`MAX_EXPONENT` is not judged as a number
    (``"1e999999999"`` matches only itself), so every comparison runs in time linear in the inputs'
    length.
    """
    a, b = normalize_answer(answer), normalize_answer(label)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    return x is not None and x == y


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


def _record_to_item(record: Any, where: str) -> tuple[str, str]:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "query" in record and "response" in record:
        query, response = record["query"], record["response"]
        if not isinstance(query, str) or not isinstance(response, str):
            raise ValueError(f"{where}: 'query' and 'response' must be strings")
        match = LABEL_PATTERN.search(response)
        if match is None:
            raise ValueError(f"{where}: 'response' has no final line 'The answer is: ...'")
        label = match.group(1)
    elif "question" in record and "answer" in record:
        query, label = record["question"], record["answer"]
        if not isinstance(query, str):
            raise ValueError(f"{where}: 'question' must be a string")
        if isinstance(label, bool) or not isinstance(label, (str, int, float)):
            raise ValueError(f"{where}: 'answer' must be a string or a number")
        label = str(label)
    else:
        raise ValueError(
            f"{where}: needs fields 'query' and 'response' (MetaMathQA) or 'question' and 'answer', "
            f"got {sorted(record)}"
        )
    if not query.strip():
        raise ValueError(f"{where}: empty question")
    if not normalize_answer(label):
        raise ValueError(f"{where}: empty answer")
    if numeral_out_of_range(label):
        raise ValueError(
            f"{where}: answer {label[:40]!r}{'...' if len(label) > 40 else ''} is a number beyond the judged range "
            f"(at most {MAX_NUMERAL_LENGTH} characters and an exponent within +-{MAX_EXPONENT})"
        )
    return query, label.strip()


@functools.lru_cache(maxsize=8)
def _load_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, str], ...]:
    items: list[tuple[str, str]] = []
    if path.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: invalid JSON ({exc.msg})") from None
                items.append(_record_to_item(record, f"{path}:{lineno}"))
    else:
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ImportError(f"reading {path} needs pyarrow (pip install pyarrow)") from None
        try:
            rows = pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises several types for unreadable files
            raise ValueError(f"{path}: not a readable parquet file ({exc})") from None
        for row_index, record in enumerate(rows):
            items.append(_record_to_item(record, f"{path}: row {row_index}"))
    if not items:
        raise ValueError(f"{path}: no questions found")
    return tuple(items)


def load_qa_items(path: str | os.PathLike) -> tuple[tuple[str, str], ...]:
    """``(question, label)`` pairs from a ``.jsonl`` or ``.parquet`` file (cached per path and
    modification time).

    Raises ``FileNotFoundError`` for a missing file, ``ValueError`` naming the file and line (row)
    for malformed input or an unsupported extension, ``ImportError`` for parquet without pyarrow.
    """
    path = os.fspath(path)
    if not path.endswith((".jsonl", ".parquet")):
        raise ValueError(f"path must end in .jsonl or .parquet, got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such QA file: {path}")
    stat = os.stat(path)
    return _load_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


# --------------------------------------------------------------------------------------------------
# The shipped arithmetic word-problem set
# --------------------------------------------------------------------------------------------------


class _SplitMix64:
    """A tiny fixed PRNG, so the generated file never depends on a library's random stream."""

    def __init__(self, seed: int):
        self.state = seed & 0xFFFFFFFFFFFFFFFF

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return z ^ (z >> 31)

    def randint(self, lo: int, hi: int) -> int:
        """Integer in ``[lo, hi]`` (the tiny modulo bias is irrelevant here)."""
        return lo + self.next() % (hi - lo + 1)

    def pick(self, seq):
        return seq[self.next() % len(seq)]


_NAMES = (
    "Alice",
    "Ben",
    "Carla",
    "David",
    "Emma",
    "Farid",
    "Grace",
    "Hugo",
    "Iris",
    "Jamal",
    "Kenji",
    "Lena",
    "Mateo",
    "Nadia",
    "Omar",
    "Priya",
    "Quinn",
    "Rosa",
    "Sam",
    "Tara",
)
_ITEMS = (
    "apples",
    "pencils",
    "marbles",
    "stickers",
    "cookies",
    "books",
    "cards",
    "shells",
    "stamps",
    "oranges",
)


def _two_names(r: _SplitMix64) -> tuple[str, str]:
    i = r.randint(0, len(_NAMES) - 1)
    j = (i + r.randint(1, len(_NAMES) - 1)) % len(_NAMES)
    return _NAMES[i], _NAMES[j]


def _add(r: _SplitMix64) -> tuple[str, str, int]:
    name, item = r.pick(_NAMES), r.pick(_ITEMS)
    a, b = r.randint(5, 90), r.randint(3, 60)
    q = f"{name} has {a} {item}. Then {name} gets {b} more {item}. How many {item} does {name} have now?"
    return (
        q,
        f"{name} starts with {a} {item} and gets {b} more, so {name} has {a} + {b} = {a + b} {item}.",
        a + b,
    )


def _subtract(r: _SplitMix64) -> tuple[str, str, int]:
    (name, friend), item = _two_names(r), r.pick(_ITEMS)
    a = r.randint(20, 120)
    b = r.randint(1, a - 2)
    q = f"{name} had {a} {item} and gave {b} of them to {friend}. How many {item} does {name} have left?"
    return q, f"{name} gave away {b} of {a} {item}, so {a} - {b} = {a - b} {item} are left.", a - b


def _multiply(r: _SplitMix64) -> tuple[str, str, int]:
    item = r.pick(_ITEMS)
    a, b = r.randint(3, 25), r.randint(2, 12)
    q = f"A box holds {a} {item}. How many {item} are there in {b} such boxes?"
    return (
        q,
        f"Each of the {b} boxes holds {a} {item}, so there are {b} * {a} = {a * b} {item}.",
        a * b,
    )


def _divide(r: _SplitMix64) -> tuple[str, str, int]:
    name, item = r.pick(_NAMES), r.pick(_ITEMS)
    each, friends = r.randint(2, 20), r.randint(2, 9)
    total = each * friends
    q = f"{name} shares {total} {item} equally among {friends} friends. How many {item} does each friend get?"
    return q, f"Each friend gets {total} / {friends} = {each} {item}.", each


def _change(r: _SplitMix64) -> tuple[str, str, int]:
    name, item = r.pick(_NAMES), r.pick(_ITEMS)
    count, price = r.randint(2, 9), r.randint(1, 9)
    cost = count * price
    bill = r.pick([b for b in (10, 20, 50, 100) if b > cost])
    q = (
        f"{name} buys {count} {item} at ${price} each and pays with a ${bill} bill. "
        f"How many dollars of change does {name} get?"
    )
    s = f"The {item} cost {count} * {price} = {cost} dollars, so the change is {bill} - {cost} = {bill - cost} dollars."
    return q, s, bill - cost


def _rectangle(r: _SplitMix64) -> tuple[str, str, int]:
    length, width = r.randint(3, 30), r.randint(2, 20)
    if r.randint(0, 1):
        q = f"A rectangle is {length} meters long and {width} meters wide. What is its area in square meters?"
        return (
            q,
            f"The area is length times width: {length} * {width} = {length * width}.",
            length * width,
        )
    q = f"A rectangle is {length} meters long and {width} meters wide. What is its perimeter in meters?"
    p = 2 * (length + width)
    return q, f"The perimeter is 2 * ({length} + {width}) = 2 * {length + width} = {p}.", p


def _reading(r: _SplitMix64) -> tuple[str, str, int]:
    name = r.pick(_NAMES)
    per_day, days, extra = r.randint(5, 40), r.randint(2, 7), r.randint(1, 30)
    total = per_day * days + extra
    q = (
        f"{name} reads {per_day} pages a day for {days} days and then {extra} more pages. "
        f"How many pages does {name} read in total?"
    )
    s = f"{name} reads {per_day} * {days} = {per_day * days} pages, then {per_day * days} + {extra} = {total} pages."
    return q, s, total


def _speed(r: _SplitMix64) -> tuple[str, str, int]:
    speed, hours = r.randint(4, 24) * 5, r.randint(2, 6)
    q = f"A train travels at {speed} kilometers per hour for {hours} hours. How many kilometers does it travel?"
    return (
        q,
        f"Distance is speed times time: {speed} * {hours} = {speed * hours} kilometers.",
        speed * hours,
    )


def _ages(r: _SplitMix64) -> tuple[str, str, int]:
    name, other = _two_names(r)
    age, extra = r.randint(3, 20), r.randint(1, 12)
    older = 2 * age + extra
    q = f"{name} is {age} years old. {other} is {extra} years older than twice {name}'s age. How old is {other}?"
    return (
        q,
        f"Twice {name}'s age is 2 * {age} = {2 * age}, and {2 * age} + {extra} = {older}.",
        older,
    )


def _percent(r: _SplitMix64) -> tuple[str, str, int]:
    pct = r.pick((10, 20, 25, 30, 40, 50, 60, 75, 80))
    base = r.randint(1, 20) * 20
    value = pct * base // 100
    q = f"What is {pct}% of {base}?"
    return q, f"{pct}% of {base} is {pct} / 100 * {base} = {value}.", value


def _sum_difference(r: _SplitMix64) -> tuple[str, str, int]:
    small, gap = r.randint(1, 50), r.randint(1, 30)
    large = small + gap
    q = f"The sum of two numbers is {small + large} and their difference is {gap}. What is the larger number?"
    s = f"The larger number is ({small + large} + {gap}) / 2 = {2 * large} / 2 = {large}."
    return q, s, large


def _two_step(r: _SplitMix64) -> tuple[str, str, int]:
    name, item = r.pick(_NAMES), r.pick(_ITEMS)
    bags, per_bag, eaten = r.randint(2, 8), r.randint(4, 15), r.randint(1, 10)
    have = bags * per_bag
    eaten = min(eaten, have - 1)
    q = (
        f"{name} buys {bags} bags with {per_bag} {item} in each bag and then loses {eaten} {item}. "
        f"How many {item} does {name} have?"
    )
    s = f"{name} buys {bags} * {per_bag} = {have} {item}, and {have} - {eaten} = {have - eaten} are left."
    return q, s, have - eaten


_TEMPLATES = (
    _add,
    _subtract,
    _multiply,
    _divide,
    _change,
    _rectangle,
    _reading,
    _speed,
    _ages,
    _percent,
    _sum_difference,
    _two_step,
)


def generate_arithmetic_qa(num_items: int = 300, seed: int = 0) -> list[dict[str, str]]:
    """Arithmetic word problems in MetaMathQA's schema: ``{"query": ..., "response": "... The answer
    is: N"}``.

    Deterministic (a fixed SplitMix64 stream, templates in round-robin order), questions are unique.
    """
    num_items = bounded_int("generate_arithmetic_qa", "num_items", num_items, 1)
    rng = _SplitMix64(seed)
    items: list[dict[str, str]] = []
    seen: set[str] = set()
    k = 0
    while len(items) < num_items:
        query, solution, answer = _TEMPLATES[k % len(_TEMPLATES)](rng)
        k += 1
        if query in seen:
            continue
        seen.add(query)
        items.append({"query": query, "response": f"{solution}\nThe answer is: {answer}"})
    return items


def arithmetic_qa_jsonl(num_items: int = 300, seed: int = 0) -> str:
    """The exact text of ``envs/text/data/arithmetic_qa.jsonl`` (one JSON object per line)."""
    return "".join(json.dumps(item) + "\n" for item in generate_arithmetic_qa(num_items, seed))


# --------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------


class MetaMathQAEnv(TextEnv):
    """Answer one question from a local QA file; a few attempts, halving reward per retry.

    ## Description At reset the seed picks one item of the file; the observation is its question.
    Each step is one answer string.

    ## Action Space
    ``Text`` (printable ASCII, up to 1024 characters): the answer. ``action_names`` is empty.

    ## Observation Space ``Text`` over printable ASCII plus every character that occurs in the
    file's questions. Reset: the question; then ``"Correct!"`` or ``"Incorrect. Please think
    again."``.

    ## Rewards A correct answer on attempt ``k`` (0-based) earns ``1 / 2**k`` (1.0 on the first
    try); an incorrect one 0.0. Correct means: equal after removing all whitespace and lower-casing
    (RAGEN's rule), or both sides parse as the same exact number (``"12.0"`` == ``"12"``, ``"1/2"``
    == ``"0.5"``, ``"1,000"`` == ``"1000"``). A numeral over 200 characters or with an exponent
    beyond +-1000 (``"1e999999999"``) is judged as text only, so judging takes time linear in the
    answer's length (such an answer is simply incorrect); a file whose label is such a numeral is
    refused at load, naming the file and line. An empty or non-string answer is invalid: 0.0,
    ``action_is_valid=False``, and it still uses up an attempt.

    ## Episode End Terminated on a correct answer. Truncated after ``max_attempts`` answers without
    a correct one. Stepping after the end returns the last observation, reward 0.0, the same end
    flags and ``action_is_valid=False``.

    ## Info ``success`` (answered correctly), ``action_is_valid`` (non-empty string),
    ``action_is_effective`` (correct), ``attempts`` (answers given so far).

    ## Arguments
    - ``path``: a ``.jsonl`` or ``.parquet`` file with ``query``/``response`` (label = the text
      after ``The answer is: `` at the end of the response) or ``question``/``answer`` fields.
      ``None`` (default) uses the shipped ``envs/text/data/arithmetic_qa.jsonl`` (300 arithmetic
      word problems).
    - ``max_attempts`` (3): answers allowed per episode.
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options
    ``reset(options={"index": i})`` asks question ``i`` of the file instead of a seeded pick.
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        max_attempts: int = 3,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        max_attempts = bounded_int("MetaMathQAEnv", "max_attempts", max_attempts, 1)
        self.path = Path(path) if path is not None else DEFAULT_PATH
        self.items = load_qa_items(self.path)
        self.max_attempts = max_attempts

        question_chars = "".join(sorted({ch for query, _ in self.items for ch in query}))
        longest = max(len(query) for query, _ in self.items)
        self.observation_space = text_space(question_chars, max_length=max(8192, longest))
        self.action_space = text_space(max_length=MAX_ANSWER_LENGTH)

        self.index: int | None = None
        self.question = ""
        self.answer = ""
        self.attempts = 0
        self._obs = ""
        self._terminated = False
        self._truncated = False

    def __len__(self) -> int:
        return len(self.items)

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("index",))
        if "index" in options:
            index = bounded_int(
                "MetaMathQAEnv", "options['index']", options["index"], 0, len(self.items) - 1
            )
        else:
            index = int(self.np_random.integers(len(self.items)))
        self.index = index
        self.question, self.answer = self.items[index]
        self.attempts = 0
        self._obs = self.question
        self._terminated = self._truncated = False
        return self._obs, self._info(success=False, valid=True, effective=False)

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.index is None:
            raise RuntimeError("MetaMathQAEnv: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._obs,
                0.0,
                self._terminated,
                self._truncated,
                self._info(success=self._terminated, valid=False, effective=False),
            )
        attempt = self.attempts
        self.attempts += 1
        valid = isinstance(action, str) and bool(action.strip())
        correct = valid and answers_match(action, self.answer)
        reward = 1.0 / 2**attempt if correct else 0.0
        self._terminated = correct
        self._truncated = not correct and self.attempts >= self.max_attempts
        self._obs = CORRECT_TEXT if correct else INCORRECT_TEXT
        return (
            self._obs,
            reward,
            self._terminated,
            self._truncated,
            self._info(success=correct, valid=valid, effective=correct),
        )

    def _info(self, *, success: bool, valid: bool, effective: bool) -> dict[str, Any]:
        return {
            "success": success,
            "action_is_valid": valid,
            "action_is_effective": effective,
            "attempts": self.attempts,
        }

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: the item's label (``answer``)."""
        return f"the answer is {self.answer}", (str(self.answer),)

    def _render_text(self) -> str:
        return self._obs


if __name__ == "__main__":  # regenerate the shipped file: python -m envs.text.metamathqa
    DEFAULT_PATH.write_text(arithmetic_qa_jsonl(), encoding="utf-8")
    print(f"wrote {DEFAULT_PATH}")
