"""scripts/plot_run.py on a hand-made metrics.csv."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "plot_run.py"
plot_run = load_script("scripts/plot_run.py", "plot_run")

# Lightning's CSVLogger layout: the module and the callbacks log the same step in separate rows; MI
# every 2nd step
CSV = """epoch,step,iteration,train/score,rollout/in_group_reward_std,actor/entropy,actor/grad_norm,collapse/first_turn/mi,collapse/first_turn/conditional_entropy,collapse/first_turn/mi_upper_bound,rollout/filter_kept_ratio
0,0,0.0,0.1,1.0,2.0,1.0,,,,1.0
,0,,,,,,0.9,3.0,1.3862943611198906,
0,1,1.0,0.2,0.8,1.9,1.2,,,,1.0
0,2,2.0,0.3,0.3,1.5,9.0,,,,0.5
,2,,,,,,0.1,2.8,1.3862943611198906,
0,3,3.0,0.3,0.1,0.4,1.1,,,,0.25
,3,,,,,,0.05,0.5,1.3862943611198906,
"""


def test_read_metrics_merges_rows_of_a_step(tmp_path):
    run = tmp_path / "csv" / "version_0"
    run.mkdir(parents=True)
    (run / "metrics.csv").write_text(CSV)
    series = plot_run.read_metrics(tmp_path)  # a folder: the newest metrics.csv below it
    # iteration = logged + 1
    assert series["train/score"] == [(1.0, 0.1), (2.0, 0.2), (3.0, 0.3), (4.0, 0.3)]
    # callback rows carry no iteration: the step's merged row gives it
    assert series["collapse/first_turn/mi"] == [(1.0, 0.9), (3.0, 0.1), (4.0, 0.05)]
    assert "epoch" not in series and "step" not in series


def test_regimes_and_default_splits():
    # i_split = half of log 4 = 0.693; with h_split 2.0
    assert plot_run.regime(3.0, 0.9, 2.0, math.log(4) / 2) == "diverse reasoning"
    assert plot_run.regime(0.5, 0.9, 2.0, math.log(4) / 2) == "compressed reasoning"
    assert plot_run.regime(2.8, 0.1, 2.0, math.log(4) / 2) == "template collapse"
    assert plot_run.regime(0.5, 0.05, 2.0, math.log(4) / 2) == "low-entropy collapse"


@pytest.mark.slow
def test_dashboard_png_is_written(tmp_path):
    (tmp_path / "metrics.csv").write_text(CSV)
    out = plot_run.main(
        [str(tmp_path / "metrics.csv"), "--out", str(tmp_path / "d.png"), "--title", "t"]
    )
    import matplotlib.image

    img = matplotlib.image.imread(out)
    assert img.shape[:2] == (1080, 1350)  # 15 x 12 inches at 90 dpi
    with pytest.raises(FileNotFoundError, match="no metrics.csv"):
        plot_run.find_csv(tmp_path / "nothing")


# A run's validations as Lightning writes them (validate_first, validation every 2 iterations): the
# validation before any update is logged at step 0 before iteration 0's row, each later one at the
# step of the iteration it follows
VAL_CSV = """epoch,step,iteration,train/success,val/success,val_success,collapse/first_turn/mi
0,0,,,0.25,0.25,
,0,,,,,0.5
0,0,0.0,0.5,,,
0,1,1.0,0.5,,,
0,1,,,0.5,0.5,
0,2,2.0,0.5,,,
0,3,3.0,0.75,,,
0,3,,,0.625,0.625,
"""


def test_validation_sits_at_the_iterations_done_before_it(tmp_path):
    (tmp_path / "metrics.csv").write_text(VAL_CSV)
    series = plot_run.read_metrics(tmp_path / "metrics.csv")
    # the warm start's validation is iteration 0; the others follow iterations 2 and 4 (0-based 1
    # and 3)
    assert series["val/success"] == [(0, 0.25), (2.0, 0.5), (4.0, 0.625)]
    assert series["val_success"] == series["val/success"]
    assert series["train/success"] == [(1.0, 0.5), (2.0, 0.5), (3.0, 0.5), (4.0, 0.75)]
    # a callback row takes its step's iteration
    assert series["collapse/first_turn/mi"] == [(1.0, 0.5)]
    # one iteration, both validations at step 0 (before and after the iteration's row): 0 and 1,
    # neither lost
    one = "epoch,step,iteration,train/success,val/success\n0,0,,,0.25\n0,0,0.0,0.5,\n0,0,,,0.75\n"
    (tmp_path / "metrics.csv").write_text(one)
    assert plot_run.read_metrics(tmp_path / "metrics.csv")["val/success"] == [
        (0, 0.25),
        (1.0, 0.75),
    ]
    # a validation at a step no iteration logged: after the last iteration before it in the file;
    # none: 0
    (tmp_path / "metrics.csv").write_text(
        "epoch,step,iteration,val/success\n0,0,,0.25\n0,4,4.0,\n0,7,,0.5\n"
    )
    assert plot_run.read_metrics(tmp_path / "metrics.csv")["val/success"] == [(0, 0.25), (5.0, 0.5)]


def test_default_splits_read_a_healthy_run_as_healthy():
    # docs/dashboard_bandit.png's run: MI bounds log 8 (first turn) and log 16 (trajectory), MI
    # 0.64-1.07, H(Z|X) 0.04-0.21
    bounds = {
        "collapse/first_turn/mi_upper_bound": [(2.0, math.log(8))],
        "collapse/trajectory/mi_upper_bound": [(2.0, math.log(16))],
    }
    h_split, i_split = plot_run.default_splits(bounds)
    # 0.2426
    assert h_split == 0.5 and i_split == pytest.approx(
        0.1 * (3 * math.log(2) + 4 * math.log(2)) / 2
    )
    assert plot_run.regime(0.1, 0.64, h_split, i_split) == "compressed reasoning"
    # the former default, half the mean bound (1.213), put the same point in "low-entropy collapse"
    assert plot_run.regime(0.1, 0.64, 0.5, 0.5 * 3.5 * math.log(2)) == "low-entropy collapse"
    # docs/learning.md's template collapse (log 8: split 0.208): MI 0.278 -> 0.134 at H(Z|X) 0.29 ->
    # 0.33, h split 0.15
    _, i_split = plot_run.default_splits(
        {"collapse/first_turn/mi_upper_bound": [(1.0, math.log(8))]}
    )
    assert plot_run.regime(0.29, 0.278, 0.15, i_split) == "diverse reasoning"
    assert plot_run.regime(0.33, 0.134, 0.15, i_split) == "template collapse"
    # no bound logged: half the largest MI
    assert plot_run.default_splits({"collapse/first_turn/mi": [(1.0, 0.2), (2.0, 0.6)]}) == (
        0.5,
        0.3,
    )


def test_reward_std_of_groups_of_one_is_marked_not_the_echo_trap():
    zeros = {"train/pass@1": [(1.0, 0.2)], "rollout/in_group_reward_std": [(1.0, 0.0), (2.0, 0.0)]}
    assert plot_run.group_size(zeros) == 1
    assert plot_run.reward_std_note(zeros).startswith("group size 1: no in-group reward std")
    # --data.filter.over states
    per_state = {**zeros, "rollout/in_group_reward_std": [(1.0, 0.4), (2.0, 0.0)]}
    assert plot_run.reward_std_note(per_state) == "group size 1: the std over each state's branches"
    groups = {"train/pass@8": [(1.0, 0.5)], "rollout/in_group_reward_std": [(1.0, 0.0)]}
    assert plot_run.group_size(groups) == 8 and plot_run.reward_std_note(groups) is None
    # validation's pass@k is not the training group
    assert plot_run.group_size({"val/pass@1": [(0, 0.3)]}) is None


@pytest.mark.slow
def test_success_plot_draws_validation_and_training_success(tmp_path, monkeypatch):
    (tmp_path / "metrics.csv").write_text(VAL_CSV)
    drawn = []
    real = plot_run._plot
    monkeypatch.setattr(
        plot_run,
        "_plot",
        lambda ax, series, keys, *a, **k: (
            drawn.append({key: series.get(key) for key in keys}) or real(ax, series, keys, *a, **k)
        ),
    )
    out = plot_run.main(
        [str(tmp_path / "metrics.csv"), "--success", "--out", str(tmp_path / "s.png")]
    )
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[:2] == (440, 770)  # 7 x 4 inches at 110 dpi
    assert drawn == [
        {
            "val/success": [(0, 0.25), (2.0, 0.5), (4.0, 0.625)],
            "train/success": [(1.0, 0.5), (2.0, 0.5), (3.0, 0.5), (4.0, 0.75)],
        }
    ]
    (tmp_path / "metrics.csv").write_text(CSV)
    with pytest.raises(ValueError, match="no val/success"):
        plot_run.main(
            [str(tmp_path / "metrics.csv"), "--success", "--out", str(tmp_path / "s2.png")]
        )


@pytest.mark.slow
def test_the_reward_std_panel_says_group_size_one():
    series = {
        "train/pass@1": [(1.0, 0.2), (2.0, 0.3)],
        "rollout/in_group_reward_std": [(1.0, 0.0), (2.0, 0.0)],
    }
    fig = plot_run.figure(series, "t")
    assert any(text.get_text().startswith("group size 1") for text in fig.axes[1].texts)
    import matplotlib.pyplot as plt

    plt.close(fig)


@pytest.mark.slow
def test_regime_labels_inside_the_axes_and_legends_off_the_lines():
    from matplotlib.transforms import Bbox

    its = [2.0, 4.0, 6.0, 8.0]
    # MI estimates crossing the whole panel under the bound lines (as in docs/dashboard_bandit.png)
    series = {
        "collapse/first_turn/mi": [(i, v) for i, v in zip(its, [0.0, 0.7, 1.4, 2.0])],
        "collapse/trajectory/mi": [(i, v) for i, v in zip(its, [2.7, 1.8, 0.9, 0.0])],
        "collapse/first_turn/mi_upper_bound": [(i, 2.0794) for i in its],
        "collapse/trajectory/mi_upper_bound": [(i, 2.7726) for i in its],
        "collapse/first_turn/conditional_entropy": [(i, 0.0005) for i in its],
        "collapse/trajectory/conditional_entropy": [(i, 0.0004) for i in its],
    }
    fig = plot_run.figure(series, "t")
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    mi_ax, regimes = fig.axes[3], fig.axes[8]
    frame = regimes.get_window_extent(renderer)
    labels = {t.get_text(): t.get_window_extent(renderer) for t in regimes.texts}
    assert set(labels) == {
        "diverse reasoning",
        "compressed reasoning",
        "template collapse",
        "low-entropy collapse",
    }
    # clear of the frame (its spines) by at least 2 pixels on every side
    for name, box in labels.items():
        assert (
            box.x0 >= frame.x0 + 2
            and box.y0 >= frame.y0 + 2
            and box.x1 <= frame.x1 - 2
            and box.y1 <= frame.y1 - 2
        ), name
    # the regimes legend lies outside the axes; the MI legend above every line of its panel, bounds
    # included
    assert not regimes.get_legend().get_window_extent(renderer).overlaps(frame)
    lines = Bbox.union([line.get_window_extent(renderer) for line in mi_ax.get_lines()])
    assert lines.y1 > 0 and not mi_ax.get_legend().get_window_extent(renderer).overlaps(lines)
    # and inside the figure
    assert fig.bbox.contains(*regimes.get_legend().get_window_extent(renderer).p0)
    import matplotlib.pyplot as plt

    plt.close(fig)
