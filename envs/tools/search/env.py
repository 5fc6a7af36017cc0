"""Question answering by searching (RAGEN's ``search`` env, SearchQA), offline.

RAGEN asks HotpotQA questions and searches Wikipedia through a dense-retrieval server (E5 + FAISS, 61-74 GB). Here
the default is a seeded fictional encyclopaedia (:mod:`envs.tools.search.encyclopedia`: one- and
two-hop questions about invented people, cities, organisations and countries, answerable only from
its articles) searched with in-process BM25; ``data_path`` + ``corpus_path`` read real question and
passage files, and ``retrieval_url`` sends every search to a server speaking RAGEN's HTTP contract
instead (the project's ``python -m envs.tools.search.server`` or RAGEN's own), see
:mod:`envs.tools.search.retrieval`.

Actions, observations and reward follow RAGEN: ``search[<query>]`` returns the top passages in RAGEN's format
(reward 0); ``finish[<answer>]`` ends the episode with the SQuAD-normalised exact match (1.0) or, when the token F1
reaches ``f1_threshold`` (0.3), the F1 itself, else 0. Other non-empty text is taken as an answer attempt: an answer
is extracted (``\\boxed{}``, bold text, "the answer is ...", "therefore ...", the first sentence), scored the same
way, and the episode ends with ``action_is_valid=False``. Departures: ``answer[<answer>]`` is accepted as another
spelling of ``finish``; an empty ``search[]`` or empty text is invalid (RAGEN searches the empty string); a retrieval
failure raises :class:`envs.tools.search.retrieval.RetrievalError` instead of showing the error text
as search results; the extraction reads at most the first 4096 characters (time linear in the
action).

Question file schema (``.jsonl`` or ``.parquet``, one question per row): ``question`` (str) and ``ground_truth``
(str or list of str; ``answer`` / ``answers`` are accepted too). Corpus file schema:
:mod:`envs.tools.search.retrieval`.
"""

from __future__ import annotations

import functools
import os
import re
import string
from collections import Counter
from typing import Any

from gymnasium import spaces

from envs.base import (
    PromptSpec,
    TextEnv,
    ToolSpec,
    bounded_int,
    check_file,
    read_rows,
    text_space,
)
from envs.tools.search.encyclopedia import Question, World, build_world, draw_question
from envs.tools.search.retrieval import (
    BM25Retriever,
    HTTPRetriever,
    Retriever,
    bm25_for,
    format_results,
    load_corpus,
)

INSTRUCTION = (
    "You are a search agent answering questions by searching for information. Choose exactly one valid next action. "
    "Use search[<query>] to retrieve evidence and finish[<answer>] only when you are ready to submit the final "
    "answer. Inside <answer>, output exactly one action string only."
)
AVAILABLE = "Available actions: search[<query>], finish[<answer>]"
TOOL_INSTRUCTION = (
    "You are a search agent answering questions by searching for information. Call exactly one function per turn: "
    "search to retrieve evidence, finish only when you are ready to submit the final answer."
)
TOOLS = (
    ToolSpec(
        "search",
        "Search the knowledge source and return the top passages.",
        "query",
        "the search query",
        "search[{}]",
    ),
    ToolSpec(
        "finish",
        "Submit the final answer; ends the episode.",
        "answer",
        "the final answer, as short as possible",
        "finish[{}]",
    ),
)
MAX_ACTION_LENGTH = 4096
_ACTION = re.compile(r"(search|finish|answer)\[(.*)\]", re.DOTALL | re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
_BOLD = re.compile(r"\*\*([^*]+)\*\*|\*([^*]+)\*")
_ANSWER_IS = re.compile(r"(?:the\s+)?(?:correct\s+)?answer\s+is\s*:?\s*([^.!?]+)", re.IGNORECASE)
_THEREFORE = re.compile(r"\b(?:therefore|thus|so|hence)\s*,?\s*([^.!?]+)", re.IGNORECASE)


# --------------------------------------------------------------------------------------------------
# Scoring (SQuAD / HotpotQA normalisation, RAGEN's thresholds)
# --------------------------------------------------------------------------------------------------


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed."""
    return " ".join(_ARTICLES.sub(" ", text.lower().translate(_PUNCTUATION)).split())


def f1_score(prediction: str, truth: str) -> float:
    """Token F1 of the normalised strings; 0 when either is yes/no/noanswer and they differ."""
    pred, gold = normalize_answer(prediction), normalize_answer(truth)
    if pred != gold and ({pred, gold} & {"yes", "no", "noanswer"}):
        return 0.0
    pred_tokens, gold_tokens = pred.split(), gold.split()
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def score_answer(
    answer: str,
    truths: tuple[str, ...],
    f1_threshold: float = 0.3,
    correct_reward: float = 1.0,
    incorrect_reward: float = 0.0,
) -> tuple[float, bool, float]:
    """``(reward, exact_match, best_f1)`` of ``answer`` against the ground truths (RAGEN's rule:
    exact match -> ``correct_reward``; else best F1 >= ``f1_threshold`` -> ``correct_reward * F1``;
    else ``incorrect_reward``)."""
    norm = normalize_answer(answer)
    if any(norm == normalize_answer(t) for t in truths):
        return correct_reward, True, 1.0
    best = max((f1_score(answer, t) for t in truths), default=0.0)
    return (correct_reward * best if best >= f1_threshold else incorrect_reward), False, best


def extract_answer(text: str) -> str:
    """An answer from free text (RAGEN's fallback order): ``\\boxed{...}``, bold text, "the answer is ...",
    "therefore/thus/so/hence ...", the first sentence of more than five characters, else the first 100 characters."""
    text = " ".join(text[:MAX_ACTION_LENGTH].split())
    if not text:
        return ""
    match = _BOXED.search(text)
    if match:
        return match.group(1).strip()
    for m in _BOLD.finditer(text):
        candidate = (m.group(1) or m.group(2)).strip()
        if len(candidate) > 2 and any(ch.isalnum() for ch in candidate):
            return candidate
    for pattern in (_ANSWER_IS, _THEREFORE):
        match = pattern.search(text)
        if match:
            candidate = match.group(1).strip().strip(string.punctuation + " ")
            if len(candidate) > 3:
                return candidate
    sentences = [s.strip() for s in re.split(r"[.!?]+", text) if len(s.strip()) > 5]
    return sentences[0] if sentences else text[:100].strip()


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _world(world_seed: int, num_people: int) -> World:
    return build_world(world_seed, num_people=num_people)


@functools.lru_cache(maxsize=4)
def _load_questions_cached(
    path: str, mtime_ns: int, size: int
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    items = []
    for row, where in read_rows(path):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected an object, got {type(row).__name__}")  # noqa: TRY004 - names the row
        question = row.get("question")
        truth = next((row[k] for k in ("ground_truth", "answer", "answers") if k in row), None)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"{where}: needs a non-empty string field 'question'")
        truths = (
            (truth,)
            if isinstance(truth, str)
            else tuple(truth)
            if isinstance(truth, (list, tuple))
            else ()
        )
        truths = tuple(
            str(t) for t in truths if isinstance(t, (str, int, float)) and str(t).strip()
        )
        if not truths:
            raise ValueError(
                f"{where}: needs 'ground_truth' (a string or a non-empty list of strings)"
            )
        items.append((question.strip(), truths))
    if not items:
        raise ValueError(f"{path}: no questions found")
    return tuple(items)


def load_questions(path: str | os.PathLike) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``(question, ground truths)`` pairs of a question file (schema in the module docstring)."""
    path = check_file(path, "question file")
    stat = os.stat(path)
    return _load_questions_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


class _SearchActions(spaces.Text):
    """The action space: text. ``sample()`` draws well-formed actions (``search[<an article
    title>]`` three times in four, else ``finish[<an article title>]``), so a random agent,
    ``check_env`` and the env benchmark meet real search results instead of strings that never
    parse."""

    def __init__(self, titles: tuple[str, ...], **kwargs: Any):
        super().__init__(**kwargs)
        self.titles = titles

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is not None or probability is not None or not self.titles:
            return super().sample(mask=mask, probability=probability)
        title = self.titles[int(self.np_random.integers(len(self.titles)))]
        verb = "search" if self.np_random.random() < 0.75 else "finish"
        return f"{verb}[{title}]"


# --------------------------------------------------------------------------------------------------
# The env
# --------------------------------------------------------------------------------------------------


class SearchQAEnv(TextEnv):
    """Answer a question by searching a passage collection, then submitting an answer.

    ## Description
    At reset the seed draws a question: from the generated encyclopaedia of ``world_seed`` (one or two hops, see
    :mod:`envs.tools.search.encyclopedia`), or a row of ``data_path``. Each step is one action
    string: ``search[<query>]``, ``finish[<answer>]`` (or ``answer[<answer>]``), or free text taken
    as an answer.

    ## Action Space
    ``Text`` (printable ASCII, up to 4096 characters). ``action_names`` is empty.

    ## Observation Space
    ``Text`` over printable ASCII plus the characters of the questions and (for a corpus file) the passages.
    Reset: ``"Question: {q}\\nAvailable actions: search[<query>], finish[<answer>]"``. Search:
    ``"Search results for '{query}':\\n{results}\\n\\nAvailable actions: ..."`` with RAGEN's result format
    (``[Document i] (ID: ..., Score: 0.xxx)`` and the passage, 800 characters each, 4000 in all), or ``"... Maximum
    search steps reached. Episode ended without an answer."`` on the last step. Answer: ``"Your answer: {a}.
    Reward: {r:.2f}"``.

    ## Rewards
    0 for searches and invalid actions; for an answer: 1.0 on an exact match after normalisation (lower case, no
    punctuation or articles), ``F1`` when the token F1 is at least ``f1_threshold``, else 0.0.

    ## Episode End
    Terminated by an answer (``finish``/``answer`` or free text). Truncated when ``max_steps`` actions were taken
    without one. Stepping after the end returns the last observation, reward 0.0, the same flags and
    ``action_is_valid=False``.

    ## Info
    ``success`` (exact match or a positive reward), ``action_is_valid`` (a well-formed, non-empty search or finish),
    ``action_is_effective`` (a search, or an answer with positive reward), ``action_type``
    (``search``/``finish``/``fallback``/``invalid``), ``exact_match``, ``f1``.

    ## Arguments
    - ``world_seed`` (0), ``num_people`` (48), ``hops`` ((1, 2)): the generated encyclopaedia and which hop counts
      its questions have.
    - ``data_path``: a question file; needs ``corpus_path`` or ``retrieval_url``.
    - ``corpus_path``: a passage file searched with BM25.
    - ``retrieval_url``: search through a server with RAGEN's contract instead of in-process BM25;
      ``retrieval_timeout`` (30 s) per request; ``retrieval_secret_env`` names the variable holding the server's
      shared secret (``--secret-env``).
    - ``max_steps`` (10), ``max_search_results`` (5), ``max_total_chars`` (4000): RAGEN's SearchQA settings.
    - ``f1_threshold`` (0.3), ``correct_reward`` (1.0), ``incorrect_reward`` (0.0).
    - ``render_mode``: ``None`` or ``"ansi"``.

    ## Options
    ``reset(options={"index": i})`` asks question ``i`` of ``data_path``.
    """

    def __init__(
        self,
        world_seed: int = 0,
        num_people: int = 48,
        hops: tuple[int, ...] | list[int] = (1, 2),
        data_path: str | os.PathLike | None = None,
        corpus_path: str | os.PathLike | None = None,
        retrieval_url: str | None = None,
        retrieval_timeout: float = 30.0,
        retrieval_secret_env: str | None = None,
        max_steps: int = 10,
        max_search_results: int = 5,
        max_total_chars: int = 4000,
        f1_threshold: float = 0.3,
        correct_reward: float = 1.0,
        incorrect_reward: float = 0.0,
        render_mode: str | None = None,
    ):
        super().__init__(render_mode=render_mode)
        hops = tuple(hops)
        if not hops or any(h not in (1, 2) for h in hops):
            raise ValueError(f"hops must be a non-empty list of 1 and/or 2, got {list(hops)}")
        max_steps = bounded_int("SearchQAEnv", "max_steps", max_steps, 1)
        max_search_results = bounded_int(
            "SearchQAEnv", "max_search_results", max_search_results, 1, 50
        )
        max_total_chars = bounded_int("SearchQAEnv", "max_total_chars", max_total_chars, 1)
        num_people = bounded_int("SearchQAEnv", "num_people", num_people, 1)
        if not 0.0 <= f1_threshold <= 1.0:
            raise ValueError(f"f1_threshold must be in [0, 1], got {f1_threshold}")
        if data_path is not None and corpus_path is None and retrieval_url is None:
            raise ValueError(
                "data_path needs corpus_path (BM25 over a passage file) or retrieval_url (a server)"
            )
        self.hops = hops
        self.max_steps, self.max_search_results, self.max_total_chars = (
            max_steps,
            max_search_results,
            max_total_chars,
        )
        self.f1_threshold, self.correct_reward, self.incorrect_reward = (
            float(f1_threshold),
            float(correct_reward),
            float(incorrect_reward),
        )
        self.world: World | None = None
        self.questions = load_questions(data_path) if data_path is not None else None
        if self.questions is None:
            self.world = _world(int(world_seed), int(num_people))
        documents = load_corpus(corpus_path) if corpus_path is not None else None
        if documents is None and self.world is not None:
            documents = self.world.documents()
        self.retriever: Retriever
        if retrieval_url is not None:
            self.retriever = HTTPRetriever(
                retrieval_url, timeout=retrieval_timeout, secret_env=retrieval_secret_env
            )
        else:
            assert documents is not None
            self.retriever = bm25_for(documents)
        self._make_spaces(corpus_path, documents)
        self.question: Question | None = None
        self.truths: tuple[str, ...] = ()
        self.step_count = 0
        self._obs = ""
        self._terminated = self._truncated = False

    def _make_spaces(
        self, corpus_path: str | os.PathLike | None, documents: tuple[tuple[str, str], ...] | None
    ) -> None:
        """The observation space (printable ASCII plus the questions' characters and, for a corpus
        file, the passages') and the action space (sampling searches for the article titles, or the
        first questions)."""
        if self.world is not None:
            titles = tuple(a.title for a in self.world.articles)
        else:
            titles = tuple(q for q, _ in self.questions or ())[:64]
        extra = {c for q, truths in self.questions or () for c in q + "".join(truths)}
        if corpus_path is not None and documents is not None:
            extra |= {c for _, text in documents for c in text}
        self.observation_space = text_space(
            "".join(sorted(extra)), max_length=8192 + self.max_total_chars
        )
        self.action_space = _SearchActions(
            titles, min_length=0, max_length=MAX_ACTION_LENGTH, charset=text_space().character_set
        )

    def prompt_spec(self) -> PromptSpec:
        return PromptSpec(instruction=INSTRUCTION, tools=TOOLS, tool_instruction=TOOL_INSTRUCTION)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict]:
        super().reset(seed=seed)
        options = self._reset_options(options, ("index",))
        if self.questions is None:
            if options:
                raise ValueError("SearchQAEnv.reset: options['index'] needs a data_path")
            assert self.world is not None
            self.question = draw_question(self.world, self.np_random, self.hops)
            self.truths = (self.question.answer,)
        else:
            index = options.get("index")
            if index is None:
                index = int(self.np_random.integers(len(self.questions)))
            else:
                index = bounded_int(
                    "SearchQAEnv", "options['index']", index, 0, len(self.questions) - 1
                )
            text, self.truths = self.questions[index]
            self.question = Question(text, self.truths[0], (text,), ("",))
        self.step_count = 0
        self._terminated = self._truncated = False
        self._obs = f"Question: {self.question.text}\n{AVAILABLE}"
        return self._obs, self._info(False, True, False, "reset")

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict]:
        if self.question is None:
            raise RuntimeError("SearchQAEnv: call reset() before step()")
        if self._terminated or self._truncated:
            return (
                self._obs,
                0.0,
                self._terminated,
                self._truncated,
                self._info(False, False, False, "invalid"),
            )
        self.step_count += 1
        text = action.strip() if isinstance(action, str) else ""
        match = (
            _ACTION.fullmatch(text[:MAX_ACTION_LENGTH]) if len(text) <= MAX_ACTION_LENGTH else None
        )
        if match and match.group(1).lower() == "search" and match.group(2).strip():
            return self._search(match.group(2).strip())
        if match and match.group(1).lower() != "search" and match.group(2).strip():
            return self._answer(match.group(2).strip(), valid=True, kind="finish")
        if text and not match:
            return self._answer(extract_answer(text), valid=False, kind="fallback")
        self._truncated = self.step_count >= self.max_steps
        self._obs = f"Invalid action. Use search[<query>] to search or finish[<answer>] to answer.\n{AVAILABLE}"
        return self._obs, 0.0, False, self._truncated, self._info(False, False, False, "invalid")

    def _search(self, query: str) -> tuple[str, float, bool, bool, dict]:
        results = format_results(
            self.retriever.search(query, self.max_search_results), self.max_total_chars
        )
        self._truncated = self.step_count >= self.max_steps
        tail = (
            "Maximum search steps reached. Episode ended without an answer."
            if self._truncated
            else AVAILABLE
        )
        self._obs = f"Search results for '{query}':\n{results}\n\n{tail}"
        return self._obs, 0.0, False, self._truncated, self._info(False, True, True, "search")

    def _answer(
        self, answer: str, *, valid: bool, kind: str
    ) -> tuple[str, float, bool, bool, dict]:
        reward, exact, f1 = score_answer(
            answer, self.truths, self.f1_threshold, self.correct_reward, self.incorrect_reward
        )
        self._terminated = True
        self._obs = f"Your answer: {answer[:200]}. Reward: {reward:.2f}"
        info = self._info(exact or reward > 0, valid, reward > 0, kind)
        info.update(exact_match=exact, f1=f1)
        return self._obs, reward, True, False, info

    def _info(self, success: bool, valid: bool, effective: bool, kind: str) -> dict[str, Any]:
        return {
            "success": bool(success),
            "action_is_valid": bool(valid),
            "action_is_effective": bool(effective),
            "action_type": kind,
        }

    def expert_turn(self, max_actions: int) -> tuple[str, tuple[str, ...]]:
        """The warm start's expert: search the chain's entities in order (one per turn), then
        answer. For a data file question: search the question, then answer the first ground
        truth."""
        q = self.question
        if q is None:
            raise RuntimeError("SearchQAEnv: call reset() before expert_turn()")
        k = self.step_count  # searches made so far (the expert never makes an invalid move)
        if k < len(q.chain):
            known = f"{q.facts[k - 1]}; " if k > 0 and q.facts[k - 1] else ""
            return f"{known}I search {q.chain[k]}", (f"search[{q.chain[k]}]",)
        fact = f"{q.facts[-1]}; " if q.facts[-1] else ""
        return f"{fact}the answer is {self.truths[0]}", (f"finish[{self.truths[0]}]",)

    def _render_text(self) -> str:
        return self._obs


__all__ = [
    "BM25Retriever",
    "SearchQAEnv",
    "extract_answer",
    "f1_score",
    "load_questions",
    "normalize_answer",
    "score_answer",
]
