"""Micro-batches on CPU threads (``--model.update.micro_batch_threads``): the same step, outputs and
scores as the loop."""

import math
import threading

import pytest
import torch

from ragen_lightning.errors import ConfigError
from ragen_lightning.parallel.threads import map_threads
from ragen_lightning.starpo.checks import check_threads_precision
from ragen_lightning.starpo.optim import MicroOutput, StepContext, accumulate
from ragen_lightning.starpo.scoring import MicroBatching, score_batch

X = torch.arange(1.0, 13.0).reshape(6, 2)  # row r of the batch: (2r + 1, 2r + 2)


def test_map_threads_keeps_the_order_uses_the_threads_and_the_callers_grad_mode():
    names, barrier = set(), threading.Barrier(2, timeout=10)

    def fn(i):
        names.add(threading.current_thread().name)
        if i < 2:
            # the first two items can only both return when they run at the same time
            barrier.wait()
        return i * i, torch.is_grad_enabled()

    assert map_threads(fn, range(5), 2) == [(i * i, True) for i in range(5)]
    assert len(names) == 2 and all(n.startswith("micro-batch") for n in names)
    with torch.no_grad():  # grad mode is thread-local: a worker would start with it on
        assert [g for _, g in map_threads(lambda i: fn(i + 2), range(3), 2)] == [False] * 3
    assert (
        map_threads(lambda i: threading.current_thread().name, range(3), 1)
        == [threading.current_thread().name] * 3
    )


def test_map_threads_raises_the_workers_error():
    def fn(i):
        if i == 1:
            raise KeyError("micro-batch 1")
        return i

    with pytest.raises(KeyError, match="micro-batch 1"):
        map_threads(fn, range(4), 2)


def _step(threads: int, poison_row: int | None = None):
    net = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 2.0]]))
    opt = torch.optim.SGD(net.parameters(), lr=0.5)

    def loss_fn(rows):
        loss = net(X[rows]).sum()
        if poison_row is not None and bool((rows == poison_row).any()):
            loss = loss * math.inf
        return MicroOutput(loss, terms={"loss": loss.detach()}, outputs=(rows[:, None].float(),))

    ctx = StepContext("actor", net, opt, MicroBatching(size=2, threads=threads))
    return net, accumulate(ctx, torch.arange(6), loss_fn)


@pytest.mark.parametrize("threads", [2, 3])
def test_threaded_micro_batches_take_the_same_step_as_the_loop(threads):
    net1, one = _step(1)
    net2, many = _step(threads)
    # loss = w . (sum of the rows) = w . (36, 42): gradient (36, 42), norm sqrt(36^2 + 42^2); w -
    # 0.5 * gradient
    assert one.stepped and many.stepped
    assert net1.weight.tolist() == net2.weight.tolist() == [[1.0 - 18.0, 2.0 - 21.0]]
    assert many.metrics["loss"] == one.metrics["loss"] == 36.0 + 84.0
    assert many.metrics["grad_norm"] == pytest.approx(math.hypot(36.0, 42.0))
    # each micro-batch's outputs come back with its rows, in the loop's order
    assert (
        [m.tolist() for m, _ in many.outputs]
        == [m.tolist() for m, _ in one.outputs]
        == [[0, 1], [2, 3], [4, 5]]
    )


def test_a_non_finite_micro_batch_skips_the_threaded_step_too():
    for threads in (1, 2):
        net, result = _step(threads, poison_row=3)
        assert not result.stepped and result.skip_reason == "non-finite loss"
        assert net.weight.tolist() == [[1.0, 2.0]] and net.weight.grad is None


def test_threaded_scoring_gives_the_loops_scores(tiny_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    actor = AutoModelForCausalLM.from_pretrained(tiny_path).eval()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 300, (5, 20), generator=g)
    att = torch.ones_like(ids)
    for i, n in enumerate((20, 7, 13, 20, 4)):
        att[i, n:] = 0
    one = score_batch(actor, ids, att, 2, kind="actor", with_entropy=True)
    many = score_batch(actor, ids, att, 2, kind="actor", with_entropy=True, threads=2)
    for a, b in zip(one, many):  # each micro-batch is computed exactly as in the loop
        assert torch.equal(a, b)
    # the shortest row (4 tokens) is a micro-batch alone, trimmed to its 3 targets: the columns
    # after read 0
    assert one[0][4, :3].ne(0).all() and one[0][4, 3:].eq(0).all()


def test_threads_need_a_precision_without_autocast_or_loss_scaling():
    for ok in (None, "32-true", "bf16-true", 32):
        check_threads_precision(2, ok)
    check_threads_precision(1, "bf16-mixed")  # the loop goes through Lightning's plugin
    with pytest.raises(
        ConfigError, match="--model.update.micro_batch_threads 2 .* --trainer.precision bf16-mixed"
    ):
        check_threads_precision(2, "bf16-mixed")
    with pytest.raises(ConfigError, match="16-mixed"):
        check_threads_precision(4, "16-mixed")


def test_threaded_gradients_add_in_micro_batch_order_whatever_finishes_first():
    """Float sums depend on their order: with micro-batch gradients 1, 1e8, -1e8, 0 the loop's
    float32 sum is ((1 + 1e8) - 1e8) + 0 = 0 (1 is lost below 1e8's precision), while adding as
    threads finish (micro-batch 0 last, it sleeps) gives (1e8 - 1e8) + 0 + 1 = 1. The threaded step
    must take the loop's step, bit for bit."""
    import time

    coefficient = torch.tensor([1.0, 1e8, -1e8, 0.0])

    def step(threads):
        w = torch.nn.Parameter(torch.tensor([5.0]))
        opt = torch.optim.SGD([w], lr=1.0)

        def loss_fn(rows):
            if int(rows[0]) == 0 and threads > 1:
                time.sleep(0.2)  # the first micro-batch finishes last
            return MicroOutput((w * coefficient[rows]).sum())

        ctx = StepContext("actor", None, opt, MicroBatching(size=1, threads=threads))
        result = accumulate(ctx, torch.arange(4), loss_fn)
        return w.detach().clone(), result

    loop, one = step(1)
    # the float32 sum is 0, by hand above
    assert loop.tolist() == [5.0] and one.metrics["grad_norm"] == 0.0
    for threads in (2, 3, 4):
        w, many = step(threads)
        assert torch.equal(w, loop) and many.metrics["grad_norm"] == 0.0, threads
