"""TrajectoryLogger: sampled trajectories as JSONL, a self-contained HTML viewer and a wandb Table.

Every ``every_n`` iterations (and at iteration 1) it takes ``num_trajectories`` of the iteration's kept
trajectories, spread over the groups, and writes

* ``<dirpath>/trajectories.jsonl``: one JSON object per trajectory (appended): iteration, ids, score, success,
  rewards per turn, the board of every turn, and the conversation as ``segments`` = runs of tokens with the same loss
  mask (``{"text", "trained"}``; trained = sampled by the model and in the loss);
* ``<dirpath>/iteration_<n>.html``: one page per logged iteration, no external resources: the multi-turn text with
  trained tokens highlighted (``span.trained``) and context/template tokens dimmed (``span.context``; a checkbox
  hides them), the score with its terms (env return + format penalty), a table of env reward and format penalty per
  turn with their totals, and grid boards (Sokoban, FrozenLake, ...) rendered as coloured cells.
  A small inline script counts the spans and fills the legend, so a browser that shows the counts ran the page;
* a wandb Table (``trajectories``) with the text, rewards and a board image per trajectory when the trainer's
  logger is a ``WandbLogger``;
* ``<dirpath>/validation.jsonl``: every episode of every validation run (not the sanity check), in the format of
  ``python -m ragen_lightning.evaluate``'s ``trajectories.jsonl`` (the chat as OpenAI messages, rewards, per-turn
  records; the one writer in ``ragen_lightning/rollout/records.py``), with evaluate's ``tag``, ``env_id`` and
  ``env_kwargs`` of the validation entry (so a mixture's or ``--data.validation.suite``'s entries can be told apart), plus
  ``iteration`` (training iterations done when it ran) and ``pass: "validation"``.

Boards are read from the user messages (``State:\\n<grid>\\n``): a block of at least two equally long lines is shown
as a grid; anything else (bandit arms, countdown numbers) is shown as text.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from callbacks._common import advance, on_schedule
from ragen_lightning.errors import ConfigError
from ragen_lightning.rollout.records import append_jsonl, episode_record

_STATE_RE = re.compile(r"State:\n(.*?)\n(?:You have|No valid action|$)", re.DOTALL)
# cell colours by symbol (Sokoban: # wall, _ floor, O target, X box, √ box on target, P player, S
# player on target; FrozenLake: _ frozen, O hole, G goal, P player, X player in hole, √ player on
# goal)
_CELL_COLOURS = {
    "#": "#555555",
    "_": "#f2f2f2",
    "O": "#f4a6a6",
    "X": "#c8a165",
    "√": "#7fc97f",
    "P": "#5b8def",
    "S": "#9b6bd6",
    "G": "#ffd34d",
}

_CSS = """
body{font-family:sans-serif;margin:1.5em;color:#222}
.traj{border:1px solid #ccc;border-radius:6px;padding:0.8em;margin-bottom:1.5em}
.conv{white-space:pre-wrap;font-family:monospace;font-size:12px;line-height:1.4;background:#fafafa;padding:0.6em}
span.trained{background:#c9f2c9;color:#000;border-bottom:1px solid #3a3}
span.context{color:#888}
body.hide-context span.context{display:none}
table.rewards td,table.rewards th{border:1px solid #ddd;padding:2px 8px;text-align:right}
table.board{border-collapse:collapse;display:inline-table;margin:0 1em 0.5em 0}
table.board td{width:18px;height:18px;text-align:center;font:11px monospace;border:1px solid #fff}
.legend{margin-bottom:1em}
.boards pre{white-space:pre-wrap;font-size:12px}
"""

_SCRIPT = """
document.addEventListener('DOMContentLoaded', function () {
  var trained = document.querySelectorAll('span.trained').length;
  var context = document.querySelectorAll('span.context').length;
  document.getElementById('mask-legend').textContent =
    trained + ' trained segments (loss mask 1, highlighted), ' + context + ' context segments (loss mask 0, grey)';
  document.body.setAttribute('data-mask-rendered', 'yes');
  document.getElementById('toggle-context').addEventListener('change', function (e) {
    document.body.classList.toggle('hide-context', e.target.checked);
  });
});
"""


def segments(input_ids: list[int], loss_mask: list[int], tokenizer: Any) -> list[dict[str, Any]]:
    """Runs of consecutive tokens with the same loss mask, decoded: ``[{"text", "trained"}]``."""
    out: list[dict[str, Any]] = []
    start = 0
    for i in range(1, len(input_ids) + 1):
        if i == len(input_ids) or bool(loss_mask[i]) != bool(loss_mask[start]):
            text = tokenizer.decode(input_ids[start:i], skip_special_tokens=False)
            out.append({"text": text, "trained": bool(loss_mask[start])})
            start = i
    return out


def boards(messages: list[dict[str, str]]) -> list[str]:
    """The ``State:`` block of every user message, in order."""
    found = []
    for msg in messages:
        if msg.get("role") == "user":
            m = _STATE_RE.search(msg.get("content", ""))
            if m:
                found.append(m.group(1).strip("\n"))
    return found


def is_grid(board: str) -> bool:
    rows = board.split("\n")
    return len(rows) >= 2 and len({len(r) for r in rows}) == 1 and len(rows[0]) >= 2


def trajectory_record(traj: Any, tokenizer: Any, iteration: int) -> dict[str, Any]:
    """The JSON-able view of one trajectory (see the module docstring)."""
    convs = [s.conversation for s in traj.samples]
    return {
        "iteration": iteration,
        "env_index": traj.env_index,
        "group_id": traj.group_id,
        "seed": traj.seed,
        "score": traj.score,
        "env_return": traj.env_return,
        "penalty": traj.penalty,
        "success": bool(traj.success),
        "num_turns": traj.num_turns,
        "turn_rewards": list(traj.turn_rewards),
        "turn_penalties": [float(t.get("penalty", 0.0)) for t in traj.turn_info]
        if len(traj.turn_info) == len(traj.turn_rewards)
        else [],
        "boards": boards(convs[0].messages) if convs else [],
        "samples": [segments(c.input_ids, c.loss_mask, tokenizer) for c in convs],
    }


def entry_fields(traj: Any, entries: Sequence[Any]) -> dict[str, Any]:
    """``{"tag", "env_id", "env_kwargs"}`` of the validation entry ``traj`` ran in: the entry with
    its tag (a mixture or ``--data.validation.suite``), the only entry for a single env's rollout
    (untagged); unknown values are None."""
    if traj.tag:
        found = [e for e in entries if e.tag == traj.tag]
    else:
        found = list(entries) if len(entries) == 1 else []
    if not found:
        return {"tag": traj.tag or None, "env_id": None, "env_kwargs": None}
    entry = found[0]
    return {"tag": entry.tag, "env_id": entry.env_id, "env_kwargs": entry.env_kwargs}


def _board_html(board: str) -> str:
    if not is_grid(board):
        return f"<pre>{html.escape(board)}</pre>"
    rows = []
    for line in board.split("\n"):
        cells = "".join(
            f'<td style="background:{_CELL_COLOURS.get(ch, "#ddd")}">{html.escape(ch)}</td>'
            for ch in line
        )
        rows.append(f"<tr>{cells}</tr>")
    return f'<table class="board">{"".join(rows)}</table>'


def _score_html(r: dict[str, Any]) -> str:
    """The score with the terms it sums (``Trajectory.score`` = env return + format penalty)."""
    penalty = r.get("penalty", 0.0)
    env_return = r.get("env_return", r["score"] - penalty)
    return f"score {r['score']:.4g} = env return {env_return:.4g} + format penalty {penalty:.4g}"


def _rewards_html(r: dict[str, Any]) -> str:
    """Per turn: the env reward and the format penalty charged; a total row (their sums: env return,
    penalty)."""
    penalties = r.get("turn_penalties") or []
    if len(penalties) != len(r["turn_rewards"]):
        # records without per-turn penalties: the total row only
        penalties = [None] * len(r["turn_rewards"])
    rows = "".join(
        f"<tr><td>{t + 1}</td><td>{v:.4g}</td><td>{'' if p is None else f'{p:.4g}'}</td></tr>"
        for t, (v, p) in enumerate(zip(r["turn_rewards"], penalties))
    )
    total = f"<tr><th>total</th><td>{sum(r['turn_rewards']):.4g}</td><td>{r.get('penalty', 0.0):.4g}</td></tr>"
    return (
        f"<table class='rewards'><tr><th>turn</th><th>reward</th><th>format penalty</th></tr>{rows}{total}"
        "</table>"
    )


def render_html(records: list[dict[str, Any]], title: str) -> str:
    """A self-contained page for ``records`` (no external CSS, JS or fonts)."""
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style><script>{_SCRIPT}</script></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        (
            "<div class='legend'><span id='mask-legend'>(enable JavaScript for the counts)</span> "
            "<label><input type='checkbox' id='toggle-context'> hide context</label></div>"
        ),
    ]
    for r in records:
        parts.append(
            f"<div class='traj'><h3>env {r['env_index']} (group {r['group_id']}, seed {r['seed']}): "
            f"{_score_html(r)}, success {r['success']}, {r['num_turns']} turns</h3>{_rewards_html(r)}"
            f"<div class='boards'>{''.join(_board_html(b) for b in r['boards'])}</div>"
        )
        for sample in r["samples"]:
            spans = "".join(
                f"<span class='{'trained' if s['trained'] else 'context'}'>{html.escape(s['text'])}</span>"
                for s in sample
            )
            parts.append(f"<div class='conv'>{spans}</div>")
        parts.append("</div>")
    parts.append("</body></html>")
    return "".join(parts)


def board_image(board: str, cell: int = 12):
    """A grid board as an ``[H, W, 3]`` uint8 image (one colour per symbol), or None for non-grid
    states."""
    if not is_grid(board):
        return None
    import numpy as np

    rows = board.split("\n")
    img = np.zeros((len(rows) * cell, len(rows[0]) * cell, 3), dtype=np.uint8)
    for r, line in enumerate(rows):
        for c, ch in enumerate(line):
            hexcol = _CELL_COLOURS.get(ch, "#dddddd").lstrip("#")
            img[r * cell : (r + 1) * cell, c * cell : (c + 1) * cell] = [
                int(hexcol[i : i + 2], 16) for i in (0, 2, 4)
            ]
    return img


class TrajectoryLogger(Callback):
    """Writes sampled trajectories to JSONL / HTML / wandb (module docstring).

    Args:
        every_n: log at iteration 1 and every ``every_n`` iterations.
        num_trajectories: trajectories per logged iteration (spread over the kept groups).
        dirpath: output folder (default ``<trainer.log_dir or default_root_dir>/trajectories``).
        jsonl: append to ``trajectories.jsonl``.
        html: write ``iteration_<n>.html``.
        wandb_table: log a wandb Table when the logger is a ``WandbLogger``.
        validation: append every validation episode to ``validation.jsonl`` (evaluate's format).
    """

    def __init__(
        self,
        every_n: int = 10,
        num_trajectories: int = 4,
        dirpath: str | None = None,
        jsonl: bool = True,
        html: bool = True,
        wandb_table: bool = True,
        validation: bool = True,
    ):
        if every_n < 1 or num_trajectories < 1:
            raise ConfigError("TrajectoryLogger every_n and num_trajectories must be >= 1")
        self.every_n, self.num_trajectories, self.dirpath = every_n, num_trajectories, dirpath
        self.jsonl, self.html, self.wandb_table, self.validation = (
            jsonl,
            html,
            wandb_table,
            validation,
        )
        self.iterations = 0
        self.written: list[str] = []

    def _dir(self, trainer: Any) -> Path:
        if self.dirpath:
            return Path(self.dirpath)
        root = getattr(trainer, "log_dir", None) or getattr(trainer, "default_root_dir", ".")
        return Path(root) / "trajectories"

    @staticmethod
    def pick(trajectories: list[Any], n: int) -> list[Any]:
        """``n`` trajectories spread evenly over the list (group-major, so over the groups)."""
        if len(trajectories) <= n:
            return list(trajectories)
        step = len(trajectories) / n
        return [trajectories[int(i * step)] for i in range(n)]

    def write(
        self, trajectories: list[Any], tokenizer: Any, iteration: int, out_dir: Path
    ) -> list[dict[str, Any]]:
        """Write the records of ``trajectories`` for ``iteration``; returns them."""
        records = [
            trajectory_record(t, tokenizer, iteration)
            for t in self.pick(trajectories, self.num_trajectories)
        ]
        out_dir.mkdir(parents=True, exist_ok=True)
        if self.jsonl:
            with open(out_dir / "trajectories.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        if self.html:
            path = out_dir / f"iteration_{iteration}.html"
            path.write_text(
                render_html(records, f"Trajectories, iteration {iteration}"), encoding="utf-8"
            )
            self.written.append(str(path))
        return records

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = advance(self, pl_module)
        if step is None:
            return
        rollout, _, iteration = step
        if (
            not rollout.trajectories
            or not on_schedule(iteration, self.every_n)
            or not trainer.is_global_zero
        ):
            return
        records = self.write(
            rollout.trajectories, pl_module.tokenizer, iteration, self._dir(trainer)
        )
        if self.wandb_table:
            self._wandb(trainer, records, iteration)

    def write_validation(
        self, trajectories: list[Any], iteration: int, out_dir: Path, entries: Sequence[Any] = ()
    ) -> int:
        """Append every validation episode to ``validation.jsonl``; returns how many. Each record
        starts with the ``tag``, ``env_id`` and ``env_kwargs`` of its validation entry (``entries``:
        the data module's ``val_entries``), as evaluate's records do."""
        records = [
            episode_record(
                t, **entry_fields(t, entries), iteration=iteration, **{"pass": "validation"}
            )
            for t in trajectories
        ]
        return append_jsonl(out_dir / "validation.jsonl", records)

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        trajectories = getattr(batch, "trajectories", None)
        if (
            not self.validation
            or trainer.sanity_checking
            or not trainer.is_global_zero
            or not trajectories
        ):
            return
        datamodule = getattr(trainer, "datamodule", None)
        iteration = getattr(datamodule, "iteration", self.iterations)
        self.write_validation(
            trajectories, int(iteration), self._dir(trainer), getattr(datamodule, "val_entries", ())
        )

    @staticmethod
    def _wandb(trainer: Any, records: list[dict[str, Any]], iteration: int) -> None:
        from lightning.pytorch.loggers import WandbLogger

        loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if not loggers:
            return
        import wandb

        table = wandb.Table(
            columns=[
                "iteration",
                "env_index",
                "group_id",
                "score",
                "penalty",
                "success",
                "turn_rewards",
                "board",
                "text",
            ]
        )
        for r in records:
            img = board_image(r["boards"][0]) if r["boards"] else None
            text = "".join(
                s["text"] if s["trained"] else f"[{s['text']}]" for s in (r["samples"] or [[]])[0]
            )
            table.add_data(
                iteration,
                r["env_index"],
                r["group_id"],
                r["score"],
                r["penalty"],
                r["success"],
                json.dumps(r["turn_rewards"]),
                wandb.Image(img) if img is not None else None,
                text,
            )
        for lg in loggers:
            lg.experiment.log({"trajectories": table}, commit=False)

    def state_dict(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "written": list(self.written)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.iterations = int(state_dict.get("iterations", 0))
        self.written = list(state_dict.get("written", []))
