"""The GPU validation kit's CPU dry run (``benchmarks/gpu_kit.py --device cpu --preset tiny``): the
recipes run through the command line on random-weight stand-ins and the written table holds their
planned and measured figures; a recipe that fails or runs out of time is a row, not the kit's
end."""

import subprocess
import sys
from pathlib import Path

import pytest

from ragen_lightning.models.memory import GIB, plan
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kit():
    return load_script("benchmarks/gpu_kit.py", "bench_gpu_kit")


def table_rows(path: Path) -> dict[str, dict[str, str]]:
    lines = [x for x in path.read_text().splitlines() if x.startswith("|")]
    cols = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [dict(zip(cols, (c.strip() for c in x.strip("|").split("|")))) for x in lines[2:]]
    return {r["recipe"]: r for r in rows}


@pytest.mark.slow
@pytest.mark.timeout(600)  # ~30 s on an idle 2-core machine; minutes when it is busy
def test_cpu_dry_run_writes_planned_and_measured_rows(kit, tmp_path):
    bad = tmp_path / "24gb-broken.yaml"  # a recipe whose setting the command line refuses
    recipe = (ROOT / "configs" / "recipes" / "24gb-qwen2.5-0.5b-full.yaml").read_text()
    assert "micro_batch_size: 1\n" in recipe
    bad.write_text(recipe.replace("micro_batch_size: 1\n", "micro_batch_size: 0\n"))
    out = tmp_path / "table.md"
    rows = kit.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--iterations",
            "1",
            "--run-dir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "--recipes",
            "24gb-qwen2.5-0.5b-full",
            "24gb-qwen2.5-7b-qlora",
            str(bad),
        ]
    )
    table = table_rows(out)
    assert list(table) == ["24gb-qwen2.5-0.5b-full", "24gb-qwen2.5-7b-qlora", "24gb-broken"]
    for name in ("24gb-qwen2.5-0.5b-full", "24gb-qwen2.5-7b-qlora"):
        row = table[name]
        assert row["status"] == "ok" and row["iterations"] == "1" and row["devices"] == "1"
        assert float(row["measured peak RSS GiB (CPU process)"]) > 0
        assert float(row["rollout tok/s"]) > 0 and float(row["update tok/s"]) > 0
    assert table["24gb-qwen2.5-7b-qlora"]["mode"] == "QLoRA"
    # the planned figure is the command line's own plan of the stand-in folder (fp32 under the tiny
    # preset; the recipe's micro-batch 1 x 2048 tokens, activation checkpointing, logits in chunks
    # of 256; its command's task config sokoban_starpo.yaml: a critic and a KL reference copy), not
    # the published 0.5B's
    tok_len = kit.tokenizer_len()
    full = kit.find_recipes(["24gb-qwen2.5-0.5b-full"])[0]
    arch = kit.kit_architecture(full, "tiny", tok_len)
    expected = (
        plan(
            arch,
            dtype="float32",
            activation_bytes=4,
            micro_batch_size=1,
            max_model_len=2048,
            logits_chunk_size=256,
            activation_checkpointing=True,
            with_critic=True,
            with_reference=True,
            max_batch_size=4,
        ).peak
        / GIB
    )
    assert float(table["24gb-qwen2.5-0.5b-full"]["planned peak GiB (GPU plan)"]) == pytest.approx(
        expected, abs=0.006
    )
    assert 1.0 < expected < 1.2  # 1 GiB of runtime overhead and a few MiB of a tiny model
    broken = table["24gb-broken"]
    assert (
        broken["status"].startswith("failed: ConfigError")
        and "micro_batch_size" in broken["status"]
    )
    assert broken["iterations"] == "0"
    assert [r.recipe for r in rows] == list(table)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_recipe_over_its_time_budget_is_stopped_and_reported(kit, tmp_path):
    out = tmp_path / "table.md"
    kit.main(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--iterations",
            "1",
            "--budget-s",
            "1",
            "--run-dir",
            str(tmp_path / "runs"),
            "--out",
            str(out),
            "--recipes",
            "24gb-qwen2.5-0.5b-full",
        ]
    )
    row = table_rows(out)["24gb-qwen2.5-0.5b-full"]
    assert row["status"] == "time budget: stopped after 1 s" and row["iterations"] == "0"
    assert float(row["wall s"]) < 60  # stopped, not waited for


def test_the_kit_imports_the_projects_envs_not_the_benchmark_of_that_name(tmp_path):
    """Run as a script, ``benchmarks/`` is ``sys.path[0]`` and holds ``envs.py``; with the
    repository root on the path already (PYTHONPATH, no pip install: how the kit first ran on a GPU
    machine) the kit's worker imported that benchmark instead of the project's ``envs`` and every
    recipe failed with an unknown ``ragen/*`` env id."""
    code = (
        f"import sys, runpy; sys.path[:0] = [{str(ROOT / 'benchmarks')!r}, {str(ROOT)!r}]; "
        f"runpy.run_path({str(ROOT / 'benchmarks' / 'gpu_kit.py')!r}, run_name='kit'); "
        "import envs, gymnasium; print(envs.__file__); print('ragen/SimpleSokoban-v0' in gymnasium.registry)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(ROOT / "envs" / "__init__.py"), "True"]
