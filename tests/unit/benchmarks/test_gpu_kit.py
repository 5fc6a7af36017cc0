"""benchmarks/gpu_kit.py's arithmetic (FLOPs, MFU, peaks by device name), recipe reading, metrics
and table; and the PeakMemory callback's CPU figure. The kit's end-to-end dry run is
tests/integration/test_gpu_kit.py."""

import re
import types
from pathlib import Path

import pytest
import torch

from ragen_lightning.models.memory import PUBLISHED, Architecture
from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def kit():
    return load_script("benchmarks/gpu_kit.py", "bench_gpu_kit")


def test_peak_tflops_by_device_name(kit):
    assert kit.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4  # SXM
    assert kit.peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert kit.peak_tflops("NVIDIA H100 NVL") == 835.0
    assert kit.peak_tflops("NVIDIA H200") == 989.4
    assert kit.peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert kit.peak_tflops("NVIDIA L40S") == 362.0  # not the L4's figure: whole words only
    assert kit.peak_tflops("NVIDIA L4") == 121.0
    assert kit.peak_tflops("NVIDIA GeForce RTX 3090") is None


def test_matmul_params_and_flops_of_qwen2_5_0_5b_by_hand(kit):
    # 24 layers, H 896, I 4864, 14 heads / 2 kv (kv dim 128), tied
    arch = PUBLISHED["Qwen/Qwen2.5-0.5B-Instruct"]
    embedding = 151936 * 896  # 136,134,656
    # q, o; k, v; gate, up, down = 14,909,440
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    # q/k/v biases, two norms per layer; the final norm
    small = 24 * (896 + 2 * 128 + 2 * 896) + 896
    # tied: the LM head is the embedding matrix, counted once
    actor = embedding + 24 * per_layer + small
    assert actor == 494_032_768 == kit.matmul_params(arch, "actor")
    critic = 24 * per_layer + small + 896 + 1  # no embedding matmul, no LM head; the value head
    assert kit.matmul_params(arch, "critic") == critic
    assert kit.update_flops_per_token(arch, "full", with_critic=True) == 6 * (actor + critic)
    assert kit.update_flops_per_token(arch, "LoRA", with_critic=True) == 4 * (actor + critic)
    assert kit.update_flops_per_token(arch, "full", with_critic=False) == 6 * actor
    assert kit.rollout_flops_per_token(arch) == 2 * actor


def test_untied_actor_counts_the_lm_head_not_the_embedding_lookup(kit):
    arch = PUBLISHED["Qwen/Qwen2.5-7B-Instruct"]
    assert not arch.tie_word_embeddings
    # backbone = embedding lookup + blocks + norm; the actor's matmuls = blocks + norm + LM head
    # (same size)
    assert kit.matmul_params(arch, "actor") == arch.backbone_params()


def test_summarize_peaks_are_maxima_speeds_skip_the_first_iteration_and_mfu_by_hand(kit):
    arch = Architecture(1, 4, 8, 2, 1, 10, True)
    recipe = types.SimpleNamespace(mode="full", with_critic=False)
    its = [
        {
            "throughput/iteration_s": 9.0,
            "throughput/rollout_tokens_per_s": 100.0,
            "throughput/update_tokens_per_s": 1000.0,
            "memory/peak_allocated_gib": 7.0,
        },
        {
            "throughput/iteration_s": 2.0,
            "throughput/rollout_tokens_per_s": 300.0,
            "throughput/update_tokens_per_s": 2000.0,
            "memory/peak_allocated_gib": 5.0,
        },
        {
            "throughput/iteration_s": 2.0,
            "throughput/rollout_tokens_per_s": 500.0,
            "throughput/update_tokens_per_s": 4000.0,
            "memory/peak_allocated_gib": 6.0,
        },
    ]
    row = kit.summarize(kit.Row("r", "m", "full", 1), its, arch, recipe, peak=2.0)
    # the warm-up iteration's peak counts
    assert row.iterations == 3 and row.peak_allocated_gib == 7.0
    # means of the last two
    assert row.rollout_tokens_per_s == 400.0 and row.update_tokens_per_s == 3000.0
    n = kit.matmul_params(arch, "actor")
    assert row.update_mfu == pytest.approx(3000.0 * 6 * n / 2e12)
    assert row.rollout_mfu == pytest.approx(400.0 * 2 * n / 2e12)
    one = kit.summarize(kit.Row("r", "m", "full", 1), its[:1], arch, recipe, peak=None)
    # one iteration: itself; no peak: no MFU
    assert one.rollout_tokens_per_s == 100.0 and one.update_mfu is None


def test_recipes_are_read_from_their_yaml(kit):
    recipes = {r.name: r for r in kit.find_recipes(None)}
    assert sorted(recipes) == [
        "24gb-qwen2.5-0.5b-full",
        "24gb-qwen2.5-1.5b-full",
        "24gb-qwen2.5-3b-lora",
        "24gb-qwen2.5-7b-qlora",
    ]
    assert [recipes[n].mode for n in sorted(recipes)] == ["full", "full", "LoRA", "QLoRA"]
    # GRPO, named by the command in the recipe's comment
    assert not recipes["24gb-qwen2.5-1.5b-full"].with_critic
    assert recipes["24gb-qwen2.5-1.5b-full"].flags == ("--model.advantage.estimator", "grpo")
    assert recipes["24gb-qwen2.5-1.5b-full"].task.name == "sokoban_starpo_s.yaml"
    assert (
        recipes["24gb-qwen2.5-3b-lora"].with_critic and recipes["24gb-qwen2.5-3b-lora"].flags == ()
    )
    assert recipes["24gb-qwen2.5-3b-lora"].task.name == "sokoban_starpo.yaml"  # GAE: a critic
    assert recipes["24gb-qwen2.5-1.5b-full"].needs_bitsandbytes  # AdamW8bit
    assert recipes["24gb-qwen2.5-7b-qlora"].needs_bitsandbytes
    assert not recipes["24gb-qwen2.5-3b-lora"].needs_bitsandbytes
    with pytest.raises(SystemExit, match="--recipes '24gb-nope'"):
        kit.find_recipes(["24gb-nope"])


def test_overlay_and_command_follow_the_flags(kit, tmp_path):
    recipe = kit.find_recipes(["24gb-qwen2.5-3b-lora"])[0]
    args = kit.parse_args(
        [
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--iterations",
            "2",
            "--num-groups",
            "4",
            "--max-turns",
            "3",
        ]
    )
    args.devices = 1
    config = kit.overlay(recipe, args, tmp_path / "model", tmp_path)
    assert (
        config["model"]["model"] == str(tmp_path / "model")
        and config["model"]["warm_start"] is False
    )
    assert config["data"]["training"] == {"num_iterations": 2, "num_groups": 4, "group_size": 2}
    assert config["data"]["episode"]["max_turns"] == 3 and config["data"]["engine"]["name"] == "hf"
    assert config["data"]["filter"] == {"strategy": "top_p", "value": 1.0, "include_zero": True}
    assert [c["class_path"] for c in config["trainer"]["callbacks"]] == [
        "callbacks.RolloutThroughput",
        "callbacks.PeakMemory",
    ]
    one = kit.cli_args(recipe, args, tmp_path / "o.yaml")
    assert one[0] == "fit" and one[2::2] == [
        str(recipe.task),
        str(recipe.path),
        str(tmp_path / "o.yaml"),
    ]
    grpo = kit.find_recipes(["24gb-qwen2.5-1.5b-full"])[0]
    assert kit.cli_args(grpo, args, tmp_path / "o.yaml")[-2:] == [
        "--model.advantage.estimator",
        "grpo",
    ]
    args.task = "other.yaml"
    assert kit.cli_args(recipe, args, tmp_path / "o.yaml")[2] == "other.yaml"
    args.devices = 2
    assert str(ROOT / "configs" / "fsdp.yaml") in kit.cli_args(recipe, args, tmp_path / "o.yaml")
    with pytest.raises(SystemExit):
        kit.parse_args(["--iterations", "0"])


def test_read_metrics_merges_rows_by_step(kit, tmp_path):
    csv = tmp_path / "csv" / "version_0" / "metrics.csv"
    csv.parent.mkdir(parents=True)
    csv.write_text(
        "step,throughput/iteration_s,throughput/update_tokens_per_s,memory/peak_rss_gib,train/x\n"
        "1,3.0,10.0,,0.5\n"
        "1,,,0.25,\n"
        # a row with nothing the kit reads (validation, say) is no iteration
        "2,,,,0.7\n"
    )
    assert kit.read_metrics(tmp_path) == [
        {
            "throughput/iteration_s": 3.0,
            "throughput/update_tokens_per_s": 10.0,
            "memory/peak_rss_gib": 0.25,
        }
    ]


def test_markdown_rows(kit):
    ok = kit.Row(
        "24gb-a",
        "A arch",
        "full",
        1,
        planned_gib=20.0,
        peak_allocated_gib=15.0,
        peak_reserved_gib=16.0,
        device_used_gib=17.5,
        device_total_gib=79.2,
        rollout_tokens_per_s=1234.5,
        update_tokens_per_s=99.0,
        rollout_mfu=0.001,
        update_mfu=0.25,
        iterations=3,
        wall_s=61.0,
    )
    oom = kit.Row("24gb-b", "B arch", "QLoRA", 1, status="failed: OutOfMemoryError: a | b")
    table = kit.markdown([ok, oom], {"device": "NVIDIA H100 80GB HBM3 x 1"}, cpu=False)
    lines = table.splitlines()
    assert lines[0] == "- device: NVIDIA H100 80GB HBM3 x 1"
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in lines
        if line.startswith("| 24gb")
    ]
    assert rows[0] == [
        "24gb-a",
        "A arch",
        "full",
        "1",
        "ok",
        "20.00",
        "15.00",
        "16.00",
        "17.50 / 79.20",
        "0.75",
        "1234.5",
        "99.0",
        "0.10 %",
        "25.0 %",
        "3",
        "61",
    ]
    assert rows[1][4] == "failed: OutOfMemoryError: a / b" and rows[1][5:] == ["-"] * 9 + ["0", "0"]
    assert re.search(r"\| recipe \| model \|", table)


def test_peak_memory_cpu_figure_is_bytes_and_at_least_the_current_resident_set():
    from callbacks.memory import cpu_peak_rss_bytes

    status = Path("/proc/self/status")
    if not status.is_file():
        pytest.skip("reads /proc/self/status (Linux)")

    def kib(field):
        return int(
            next(x for x in status.read_text().splitlines() if x.startswith(field)).split()[1]
        )

    big = torch.ones(16 * 2**20)  # 64 MiB resident while the figures are read
    assert float(big[-1]) == 1.0
    current = kib("VmRSS:") * 1024
    peak = cpu_peak_rss_bytes()
    # in kilobytes the peak would be 1024x too small to hold the tensor
    assert peak >= current > 64 * 2**20
    assert peak <= kib("VmHWM:") * 1024  # the high-water mark read afterwards (it never decreases)
