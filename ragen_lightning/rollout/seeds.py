"""Reset seeds of whole episodes: the independent, reproducible seed streams that keep training,
validation, demonstration and evaluation levels apart for one run seed.

The warm start's demonstrations (``"train"``), the demonstration module's validation (``"val"``),
the evaluation (``"eval"``, ``python -m ragen_lightning.evaluate``) and the environment mixture's
per-tag streams (``"train/<tag>/<iteration>"``, ``"val/<tag>"``) all draw from
:func:`episode_seeds`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np


def episode_seeds(seed: int, count: int, stream: str, exclude: Sequence[int] = ()) -> list[int]:
    """``count`` distinct reset seeds for ``stream`` (``"train"``, ``"val"``, ``"eval"``...), never
    in ``exclude``.

    Streams are independent draws from ``SeedSequence([seed, crc(stream)])``, so the validation and
    evaluation episodes are held-out levels for the same ``seed``.
    """
    out: list[int] = []
    banned = {int(s) for s in exclude}
    ss = np.random.SeedSequence([int(seed) % 2**63, zlib.crc32(stream.encode())])
    while len(out) < count:
        for s in ss.generate_state(2 * (count - len(out)) + 8, dtype=np.uint32).tolist():
            if s not in banned:
                banned.add(s)
                out.append(int(s))
                if len(out) == count:
                    break
        ss = ss.spawn(1)[0]
    return out
