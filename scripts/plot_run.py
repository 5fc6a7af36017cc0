"""Draw the collapse dashboard of a run from its Lightning ``metrics.csv``.

    python scripts/plot_run.py outputs/sokoban/csv --out dashboard.png
    python scripts/plot_run.py path/to/metrics.csv --out dashboard.png --title "sokoban, top_p 0.9"
    python scripts/plot_run.py outputs/sokoban/csv --success --out success.png   # validation/training success only

The task configs log with a ``CSVLogger`` next to wandb (wandb's offline run files are a binary
protobuf stream; ``wandb sync`` them and use wandb's own charts, or point this script at the CSV).
Given a folder, the newest ``metrics.csv`` under it is read. Rows of one step are merged (callbacks
and the module log separately). Training values sit at their iteration counted from 1; a validation
at the number of iterations done before it, so ``--validate_first``'s validation of the warm start
is iteration 0.

Panels over iterations: reward (``train/score``, ``train/success``) and in-group reward std, token
entropy, MI estimates with their upper bound log N, conditional entropy H(Z|X), actor/critic grad
norm, the filter's keep ratio, MI retrieval accuracy vs chance, and the four reasoning regimes
(RAGEN-2): H(Z|X) against I(X;Z) per MI measurement, coloured by iteration. With groups of one
episode (``--data.training.group_size 1``, as ``configs/sokoban.yaml`` branches instead) every
in-group reward std is 0 by construction: the panel says so rather than look like the echo trap. The
quadrant split is ``--i-split`` (default a tenth of the mean log N, the MI's upper bound: in the
runs of docs/learning.md and docs/dashboard_bandit.md reasoning that read its input measured 13-51 %
of log N, reasoning that ignored it 0-7 %) and ``--h-split`` (default 0.5 nats per reasoning token;
sampled LLM reasoning at temperature 1 typically sits around 0.3-1.5, a low-entropy collapse far
below; the tiny model's reasoning measured 0.015-0.43 while its format held, so pass a split at its
scale there, e.g. half its first measurements): high H and high I = diverse reasoning, low H and
high I = compressed reasoning, high H and low I = template collapse, low H and low I = low-entropy
collapse. The splits are conventions for reading the plot, not thresholds from the paper.
"""

from __future__ import annotations

import argparse
import csv
import math
import re
from pathlib import Path

MI_LABELS = ("first_turn", "trajectory")
DEFAULT_H_SPLIT = 0.5  # nats per reasoning token
I_SPLIT_OF_BOUND = 0.1  # the default I(X;Z) split as a fraction of the mean log N
VALIDATION = ("val/", "val_")  # the prefixes of the keys a validation logs
REWARD_STD = "rollout/in_group_reward_std"


def find_csv(path: str | Path) -> Path:
    """``path`` itself if it is a file, else the newest ``metrics.csv`` below it."""
    path = Path(path)
    if path.is_file():
        return path
    found = sorted(path.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"no metrics.csv under {path}")
    return found[-1]


def read_metrics(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """``key -> [(iteration, value), ...]`` sorted by iteration; rows of one step merged.

    A training value's iteration is the logged 0-based ``iteration`` + 1 of its step's rows (the
    callbacks' rows of a step carry none), else the step + 1. A validation value (``val/*``,
    ``val_*``) sits at the number of iterations done when it ran: its step's ``iteration`` + 1 when
    it comes after that iteration's row in the file, the ``iteration`` itself when before it
    (``--validate_first``: 0), else the last iteration before it + 1. Empty and non-finite cells are
    skipped.
    """
    steps: dict[int, dict[str, float]] = {}
    trained_at: dict[int, int] = {}  # step -> the file row that logged its iteration
    validations: list[tuple[int, int, dict[str, float]]] = []  # (file row, step, values)
    with open(find_csv(path), newline="") as f:
        for index, row in enumerate(csv.DictReader(f)):
            if not row.get("step"):
                continue
            step = int(float(row["step"]))
            values = _numbers(row)
            validation = {k: v for k, v in values.items() if k.startswith(VALIDATION)}
            if validation:
                validations.append((index, step, validation))
            rest = {k: v for k, v in values.items() if k not in validation}
            if "iteration" in rest:
                trained_at.setdefault(step, index)
            if rest or not validation:
                steps.setdefault(step, {}).update(rest)
    series: dict[str, list[tuple[float, float]]] = {}
    for step in sorted(steps):
        values = steps[step]
        it = values["iteration"] + 1 if "iteration" in values else step + 1
        for k, v in values.items():
            series.setdefault(k, []).append((it, v))
    for index, step, values in validations:
        done = _iterations_done(index, step, steps, trained_at)
        for k, v in values.items():
            series.setdefault(k, []).append((done, v))
    return {k: sorted(points, key=lambda p: p[0]) for k, points in series.items()}


def _numbers(row: dict[str, str]) -> dict[str, float]:
    out = {}
    for k, v in row.items():
        if k in ("step", "epoch") or v in ("", None):
            continue
        try:
            x = float(v)
        except ValueError:
            continue
        if math.isfinite(x):
            out[k] = x
    return out


def _iterations_done(
    index: int, step: int, steps: dict[int, dict[str, float]], trained_at: dict[int, int]
) -> float:
    """How many iterations a validation logged at file row ``index`` and ``step`` came after."""
    if step in trained_at:
        it = steps[step]["iteration"]
        return it + 1 if trained_at[step] <= index else it
    before = [steps[s]["iteration"] for s, row in trained_at.items() if row < index]
    return max(before) + 1 if before else 0.0


def group_size(series: dict[str, list[tuple[float, float]]]) -> int | None:
    """The run's group size, read from its ``train/pass@k`` key (k =
    ``--data.training.group_size``), if logged."""
    sizes = {int(m.group(1)) for k in series if (m := re.fullmatch(r"train/pass@(\d+)", k))}
    return sizes.pop() if len(sizes) == 1 else None


def reward_std_note(series: dict[str, list[tuple[float, float]]]) -> str | None:
    """What the in-group reward std panel must say beside its line: groups of one episode have no
    in-group std (the panel's 0 is not the echo trap); with groups of one, a std that is not 0 is
    over each state's branches (``--data.filter.over states``). None otherwise."""
    if group_size(series) != 1 or REWARD_STD not in series:
        return None
    if all(v == 0 for _, v in series[REWARD_STD]):
        return (
            "group size 1: no in-group reward std\n(0 by construction, not the echo trap;\n"
            "--data.filter.over states logs it per state)"
        )
    return "group size 1: the std over each state's branches"


def default_splits(series: dict[str, list[tuple[float, float]]]) -> tuple[float, float]:
    """``(h_split, i_split)`` of the regime panel when not given: ``DEFAULT_H_SPLIT`` and a tenth of
    the mean MI bound log N (without a logged bound, half the largest MI)."""
    bounds = [v for lab in MI_LABELS for _, v in series.get(f"collapse/{lab}/mi_upper_bound", [])]
    if bounds:
        return DEFAULT_H_SPLIT, I_SPLIT_OF_BOUND * sum(bounds) / len(bounds)
    mis = [v for lab in MI_LABELS for _, v in series.get(f"collapse/{lab}/mi", [])]
    return DEFAULT_H_SPLIT, 0.5 * max(max(mis, default=0.0), 1e-6)


def regime(h: float, i: float, h_split: float, i_split: float) -> str:
    """RAGEN-2's reasoning regime of a point (H(Z|X), I(X;Z))."""
    if i >= i_split:
        return "diverse reasoning" if h >= h_split else "compressed reasoning"
    return "template collapse" if h >= h_split else "low-entropy collapse"


def _plot(ax, series, keys, title, ylabel=None, styles=None):
    drawn = False
    for k in keys:
        if k in series:
            xs, ys = zip(*series[k])
            style = (styles or {}).get(k, {})
            ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=k, **style)
            drawn = True
    ax.set_title(title, fontsize=10)
    if ylabel:
        ax.set_ylabel(ylabel, fontsize=8)
    if drawn:
        ax.legend(fontsize=6, loc="best")
    else:
        ax.text(
            0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="grey"
        )
    ax.tick_params(labelsize=7)
    ax.set_xlabel("iteration", fontsize=8)
    return drawn


def dashboard(
    series: dict[str, list[tuple[float, float]]],
    out: str | Path,
    title: str = "collapse dashboard",
    h_split: float | None = None,
    i_split: float | None = None,
) -> Path:
    """Draw the dashboard PNG of ``series`` (as from :func:`read_metrics`) to ``out``; returns the
    path."""
    import matplotlib.pyplot as plt

    fig = figure(series, title, h_split, i_split)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def figure(
    series: dict[str, list[tuple[float, float]]],
    title: str = "collapse dashboard",
    h_split: float | None = None,
    i_split: float | None = None,
):
    """The dashboard's matplotlib figure (3 x 3 panels, module docstring), laid out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(15, 12))
    ax = axes.flat
    _plot(ax[0], series, ["train/score", "train/success"], "reward (mean score, success)")
    _plot(ax[1], series, [REWARD_STD], "in-group reward std (healthy: clearly > 0)")
    if note := reward_std_note(series):
        ax[1].text(
            0.5,
            0.5,
            note,
            ha="center",
            va="center",
            transform=ax[1].transAxes,
            fontsize=9,
            color="firebrick",
            bbox={"facecolor": "white", "edgecolor": "grey"},
        )
    _plot(ax[2], series, ["actor/entropy"], "token entropy (healthy: slow decline)")
    mi_keys = [f"collapse/{lab}/{k}" for lab in MI_LABELS for k in ("mi", "mi_upper_bound")]
    dashed = {k: {"linestyle": "--"} for k in mi_keys if k.endswith("upper_bound")}
    if _plot(ax[3], series, mi_keys, "MI estimate I(X;Z) (healthy: well above 0)", styles=dashed):
        _legend_above_lines(ax[3])  # "best" could put it over the dashed bound lines
    _plot(
        ax[4],
        series,
        [f"collapse/{lab}/conditional_entropy" for lab in MI_LABELS]
        + [f"collapse/{lab}/marginal_entropy" for lab in MI_LABELS],
        "H(Z|X) and H(Z) (nats/token)",
    )
    _plot(ax[5], series, ["actor/grad_norm", "critic/grad_norm"], "grad norm (spikes: collapse)")
    _plot(
        ax[6],
        series,
        ["rollout/filter_kept_ratio", "collapse/valid_thinking_rate"],
        "filter keep ratio, valid-thinking rate",
    )
    _plot(
        ax[7],
        series,
        ["collapse/first_turn/retrieval_accuracy", "collapse/first_turn/retrieval_chance_level"],
        "first-turn prompt retrieval vs chance",
    )
    _quadrant(ax[8], series, h_split, i_split)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def _legend_above_lines(ax, headroom: float = 0.5) -> None:
    """Raise the y-limit by ``headroom`` times the lines' span and put the legend (two columns) in
    that band, above every line drawn."""
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    lo, hi = min(ys + [0.0]), max(ys)
    span = (hi - lo) or 1.0
    ax.set_ylim(lo - 0.05 * span, hi + headroom * span)
    ax.legend(fontsize=6, loc="upper center", ncol=2)


def _quadrant(ax, series, h_split, i_split) -> None:
    ax.set_title("reasoning regimes: H(Z|X) vs I(X;Z)", fontsize=10)
    ax.set_xlabel("H(Z|X) conditional entropy (nats/token)", fontsize=8)
    ax.set_ylabel("I(X;Z) MI estimate (nats)", fontsize=8)
    ax.tick_params(labelsize=7)
    points = []
    for lab in MI_LABELS:
        h = dict(series.get(f"collapse/{lab}/conditional_entropy", []))
        i = dict(series.get(f"collapse/{lab}/mi", []))
        points += [(it, h[it], i[it], lab) for it in sorted(set(h) & set(i))]
    if not points:
        ax.text(
            0.5,
            0.5,
            "MI not logged",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="grey",
        )
        return
    hs, is_ = [p[1] for p in points], [p[2] for p in points]
    default_h, default_i = default_splits(series)
    h_split = default_h if h_split is None else h_split
    i_split = default_i if i_split is None else i_split
    pad_h = max(0.1, 0.15 * (max(hs) - min(hs)))
    pad_i = max(0.1, 0.15 * (max(is_ + [i_split]) - min(is_ + [0.0])))
    x0, x1 = min(hs + [h_split]) - pad_h, max(hs + [h_split]) + pad_h
    y0, y1 = min(is_ + [0.0]) - pad_i, max(is_ + [i_split]) + pad_i
    ax.set_xlim(x0, x1)
    ax.set_ylim(y0, y1)
    ax.axvline(h_split, color="grey", linewidth=0.8)
    ax.axhline(i_split, color="grey", linewidth=0.8)
    for (hx, iy), name in (
        ((0.98, 0.98), "diverse reasoning"),
        ((0.02, 0.98), "compressed reasoning"),
        ((0.98, 0.02), "template collapse"),
        ((0.02, 0.02), "low-entropy collapse"),
    ):
        # in axes coordinates, inset from the corners: a label never reaches past the frame
        ax.text(
            hx,
            iy,
            name,
            transform=ax.transAxes,
            ha="right" if hx > 0.5 else "left",
            va="top" if iy > 0.5 else "bottom",
            fontsize=8,
            color="firebrick" if "collapse" in name else "darkgreen",
        )
    for lab, marker in zip(MI_LABELS, ("o", "^")):
        pts = [p for p in points if p[3] == lab]
        if pts:
            sc = ax.scatter(
                [p[1] for p in pts],
                [p[2] for p in pts],
                c=[p[0] for p in pts],
                cmap="viridis",
                marker=marker,
                label=lab,
                edgecolors="k",
                linewidths=0.3,
            )
    # below the axes: inside, it covers the split lines or the points whatever its corner
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    ax.figure.colorbar(sc, ax=ax, label="iteration")


def success_plot(
    series: dict[str, list[tuple[float, float]]],
    out: str | Path,
    title: str = "success per iteration",
) -> Path:
    """One panel: validation success (the fixed validation levels; with ``--validate_first`` the
    first point, at iteration 0, is the model before any update) and training success per iteration;
    returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if "val/success" not in series:
        raise ValueError("no val/success in the metrics: the run logged no validation")
    fig, ax = plt.subplots(figsize=(7, 4))
    _plot(
        ax,
        series,
        ["val/success", "train/success"],
        title,
        ylabel="success rate",
        styles={"train/success": {"alpha": 0.35}},
    )
    ax.set_ylim(0, 1)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "metrics", help="metrics.csv or a folder holding one (e.g. outputs/sokoban/csv)"
    )
    parser.add_argument("--out", default="dashboard.png", help="PNG to write")
    parser.add_argument("--title", default=None)
    parser.add_argument(
        "--h-split",
        type=float,
        default=None,
        help=f"H(Z|X) quadrant split (default {DEFAULT_H_SPLIT})",
    )
    parser.add_argument(
        "--i-split",
        type=float,
        default=None,
        help=f"I(X;Z) quadrant split (default {I_SPLIT_OF_BOUND} x the mean MI bound log N)",
    )
    parser.add_argument(
        "--success",
        action="store_true",
        help="draw only validation and training success per iteration (the README's learning plot)",
    )
    args = parser.parse_args(argv)
    csv_path = find_csv(args.metrics)
    series = read_metrics(csv_path)
    if args.success:
        out = success_plot(series, args.out, args.title or f"success per iteration: {csv_path}")
    else:
        out = dashboard(
            series,
            args.out,
            args.title or f"collapse dashboard: {csv_path}",
            args.h_split,
            args.i_split,
        )
    print(out)
    return out


if __name__ == "__main__":
    main()
