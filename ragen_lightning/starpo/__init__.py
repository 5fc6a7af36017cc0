"""StarPO: the LightningModule (:mod:`.module`), its settings groups (:mod:`.settings`), the
advantage estimators' table (:mod:`.estimators`) and the update (:mod:`.ppo`, :mod:`.optim`).

Only the estimator table is imported here (torch only); its home, with the filters', is
:mod:`ragen_lightning.registry`.
Import the module from :mod:`ragen_lightning.starpo.module`."""

from ragen_lightning.starpo.estimators import (
    ESTIMATORS,
    Estimator,
    get_estimator,
    register_estimator,
)

__all__ = ["ESTIMATORS", "Estimator", "get_estimator", "register_estimator"]
