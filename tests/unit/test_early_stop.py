import pytest

from ragen_lightning.starpo.early_stop import (
    LowValidationSuccess,
    RewardVarianceCollapse,
)


def test_reward_variance_collapse_by_hand():
    rule = RewardVarianceCollapse(window=3, ratio=0.1)
    # baseline = mean(0.4, 0.6, 0.5) = 0.5 -> collapse threshold 0.05
    assert [rule.update(v) for v in (0.4, 0.6, 0.5)] == [False, False, False]
    assert rule.baseline == pytest.approx(0.5)
    assert [rule.update(v) for v in (0.01, 0.02)] == [False, False]  # window not full yet
    assert rule.update(0.06) is False  # 0.06 >= 0.05 breaks the streak
    assert [rule.update(v) for v in (0.0, 0.0)] == [False, False]  # window is (0.06, 0, 0)
    assert rule.update(0.049) is True  # window (0, 0, 0.049) all below 0.05


def test_reward_variance_collapse_state_round_trip_and_disable():
    rule = RewardVarianceCollapse(window=2, ratio=0.5)
    for v in (1.0, 1.0, 0.1):
        rule.update(v)
    resumed = RewardVarianceCollapse(window=2, ratio=0.5)
    resumed.load_state_dict(rule.state_dict())
    assert resumed.update(0.2) is True and rule.update(0.2) is True
    off = RewardVarianceCollapse(window=0)
    assert not any(off.update(0.0) for _ in range(50))
    with pytest.raises(ValueError):
        RewardVarianceCollapse(window=-1)


def test_low_validation_success_streak():
    rule = LowValidationSuccess(patience=3, threshold=0.01)
    assert [rule.update(v) for v in (0.0, 0.005, 0.5, 0.0, 0.0)] == [
        False,
        False,
        False,
        False,
        False,
    ]
    assert rule.update(0.009) is True
    resumed = LowValidationSuccess(patience=3)
    resumed.load_state_dict({"streak": 2})
    assert resumed.update(0.0) is True
    assert not LowValidationSuccess(patience=0).update(0.0)
