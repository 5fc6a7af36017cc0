"""Generated propositional theorems for :mod:`envs.logic.env`: provable by construction, with a
depth knob and train/val/test splits disjoint by content.
"""

from __future__ import annotations

import zlib

import numpy as np

from envs.logic.formulas import Formula, atom, conj, disj, imp, initial_state, neg, show
from envs.logic.prover import prove_state

ATOMS = ("p", "q", "r", "s", "t", "u", "v", "w")
SPLITS = {"train": range(8), "val": range(8, 9), "test": range(9, 10)}
_TRANSFORMS = (
    "imp_intro",
    "and_intro",
    "or_intro",
    "mp",
    "and_elim",
    "or_elim",
    "neg_intro",
    "explosion",
)


def split_of(theorem: Formula) -> str:
    """The split a theorem belongs to: a stable hash of its text, 8 of 10 buckets train, 1 val, 1
    test. Drawing by seed and filtering by this bucket keeps the splits disjoint by content,
    whatever seeds they are drawn with."""
    bucket = zlib.crc32(show(theorem).encode()) % 10
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def generate_theorem(rng: np.random.Generator, depth: int = 3, num_atoms: int = 4) -> Formula:
    """A provable theorem built by ``depth`` sound construction steps from ``a |- a``.

    The state is a sequent (premises ``P``, target ``T``) that is provable by construction; each step keeps it so:
    ``imp_intro`` moves a premise into the target (``X -> T``); ``and_intro`` conjoins a premise (or a new atom
    premise) to the target; ``or_intro`` disjoins any small formula; ``mp`` replaces a premise ``X`` by ``Y -> X``
    and adds ``Y``; ``and_elim`` replaces ``X`` by ``X /\\ Y``; ``or_elim`` replaces ``X`` by ``Y \\/ Z`` with
    ``Y -> X`` and ``Z -> X``; ``neg_intro`` turns the target into ``~Y`` with the premise ``Y -> ~T``;
    ``explosion`` replaces ``X`` by ``Y`` and ``~Y``. The theorem is the premises, shuffled, curried onto the
    target: ``P1 -> ... -> Pn -> T``.
    """
    atoms = ATOMS[:num_atoms]
    first = _new_atom(rng, atoms)
    premises: list[Formula] = [first]
    target: Formula = first
    for _ in range(depth):
        step = _TRANSFORMS[int(rng.integers(len(_TRANSFORMS)))]
        if not premises and step not in ("and_intro", "or_intro", "neg_intro"):
            step = "and_intro"
        j = int(rng.integers(len(premises))) if premises else 0
        target = _transform(step, premises, target, j, rng, atoms)
    order = rng.permutation(len(premises))
    theorem = target
    for i in order[::-1]:
        theorem = imp(premises[int(i)], theorem)
    return theorem


def _new_atom(rng: np.random.Generator, atoms: tuple[str, ...]) -> Formula:
    return atom(atoms[int(rng.integers(len(atoms)))])


def _small(rng: np.random.Generator, atoms: tuple[str, ...]) -> Formula:
    a = _new_atom(rng, atoms)
    return neg(a) if rng.random() < 0.25 else a


def _transform(
    step: str,
    premises: list[Formula],
    target: Formula,
    j: int,
    rng: np.random.Generator,
    atoms: tuple[str, ...],
) -> Formula:
    """One construction step of :func:`generate_theorem` on premise ``j``: changes ``premises`` in
    place and returns the new target. The draws' order is part of the result: a seed must keep
    giving the same theorem."""
    if step == "imp_intro":
        target = imp(premises.pop(j), target)
    elif step == "and_intro":
        if premises and rng.random() < 0.5:
            side = premises[j]
        else:
            side = _new_atom(rng, atoms)
            premises.append(side)
        target = conj(target, side) if rng.random() < 0.5 else conj(side, target)
    elif step == "or_intro":
        other = _small(rng, atoms)
        target = disj(target, other) if rng.random() < 0.5 else disj(other, target)
    elif step == "mp":
        y = _new_atom(rng, atoms)
        premises[j] = imp(y, premises[j])
        premises.append(y)
    elif step == "and_elim":
        y = _small(rng, atoms)
        premises[j] = conj(premises[j], y) if rng.random() < 0.5 else conj(y, premises[j])
    elif step == "or_elim":
        x, y, z = premises[j], _new_atom(rng, atoms), _new_atom(rng, atoms)
        premises[j] = disj(y, z)
        premises += [imp(y, x), imp(z, x)]
    elif step == "neg_intro":
        y = _new_atom(rng, atoms)
        premises.append(imp(y, neg(target)))
        target = neg(y)
    else:  # explosion
        y = _new_atom(rng, atoms)
        premises[j] = y
        premises.append(neg(y))
    return target


def draw_theorem(
    rng: np.random.Generator,
    depth: int = 3,
    num_atoms: int = 4,
    split: str = "train",
    max_draws: int = 1000,
) -> Formula:
    """Theorems from :func:`generate_theorem` until one is in ``split`` (see :func:`split_of`) and
    the proof search proves it (its construction makes it provable; the search bounds only keep the
    expert's plans short)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    for _ in range(max_draws):
        theorem = generate_theorem(rng, depth, num_atoms)
        if split_of(theorem) == split and prove_state(initial_state(theorem)) is not None:
            return theorem
    raise RuntimeError(
        f"no {split} theorem of depth {depth} over {num_atoms} atoms in {max_draws} draws"
    )
