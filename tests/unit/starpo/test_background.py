"""The critic's steps on a worker thread (``--model.critic.in_background``): joining, counting,
errors."""

import threading
from types import SimpleNamespace

import pytest
import torch

from ragen_lightning.errors import TrainingStopped
from ragen_lightning.starpo.background import BackgroundSteps, count_steps
from ragen_lightning.starpo.optim import StepContext
from ragen_lightning.starpo.scoring import MicroBatching


class CountingOptimizer:
    """What ``count_steps`` needs of Lightning's optimizer wrapper: param groups and ``step``."""

    def __init__(self, *params):
        self.param_groups, self.steps = [{"params": list(params)}], 0

    def step(self):
        self.steps += 1


def test_a_job_runs_on_the_worker_while_the_caller_goes_on_and_join_returns_its_logs_once():
    opt = CountingOptimizer(torch.nn.Parameter(torch.ones(1)))
    bg = BackgroundSteps()
    started, release = threading.Event(), threading.Event()

    def job():
        started.set()
        assert release.wait(10)  # only returns once the caller, still running, releases it
        return {"critic/vf_loss": 1.5, "thread": threading.current_thread().name}

    assert bg.join() == {}  # nothing submitted yet
    bg.submit(job, steps=3, optimizer=opt)
    assert started.wait(10) and bg.pending
    assert opt.steps == 3  # counted at submission, from the caller's thread
    with pytest.raises(RuntimeError, match="not joined"):
        bg.submit(job)
    release.set()
    bg.wait()  # a checkpoint waits without taking the logs
    logs = bg.join()
    assert logs["critic/vf_loss"] == 1.5 and logs["thread"].startswith("critic-steps")
    assert bg.join() == {} and not bg.pending
    bg.close()


def test_the_jobs_error_is_raised_by_the_join_and_the_next_job_runs():
    bg = BackgroundSteps()

    def stop():
        raise TrainingStopped("critic skipped 5 steps in a row")

    bg.submit(stop, steps=2)  # no optimizer: nothing to count
    with pytest.raises(TrainingStopped, match="5 steps"):
        bg.join()
    bg.submit(lambda: {"ok": 1.0})
    assert bg.join() == {"ok": 1.0}
    bg.close()


def test_counting_steps_changes_no_weight_and_refuses_a_network_holding_gradients():
    net = torch.nn.Linear(2, 1, bias=False)
    opt = torch.optim.AdamW(net.parameters(), lr=1.0)
    before = net.weight.detach().clone()
    count_steps(opt, 3)  # no gradient: AdamW skips every parameter
    assert torch.equal(net.weight, before) and len(opt.state) == 0
    net(torch.ones(1, 2)).sum().backward()
    with pytest.raises(RuntimeError, match="without gradients"):
        count_steps(opt, 1)


def test_the_worker_backpropagates_directly_and_steps_the_raw_optimizer():
    net = torch.nn.Linear(2, 1, bias=False)
    raw = torch.optim.SGD(net.parameters(), lr=1.0)
    wrapped = SimpleNamespace(optimizer=raw)  # what a LightningOptimizer holds
    ctx = StepContext(
        "critic", net, wrapped, MicroBatching(threads=2), backward=pytest.fail, pad_row=-1
    )
    worker = ctx.outside_lightning()
    assert worker.optimizer is raw and worker.micro.threads == 1 and worker.pad_row == -1
    loss = net(torch.ones(1, 2)).sum()
    worker.backward(loss)  # autograd's, not the module's (pytest.fail)
    assert net.weight.grad.tolist() == [[1.0, 1.0]]


def test_active_only_with_the_flag_a_critic_one_process_and_no_shared_lora_base():
    def module(flag=True, critic=True, lora=None):
        return SimpleNamespace(
            settings=SimpleNamespace(critic=SimpleNamespace(in_background=flag)),
            hparams={"lora": lora},
            critic=object() if critic else None,
        )

    bg = BackgroundSteps(module())
    assert bg.active() is bg
    assert BackgroundSteps(module(flag=False)).active() is None
    assert BackgroundSteps(module(critic=False)).active() is None  # GRPO family: nothing to move
    assert BackgroundSteps(module(lora={"shared_base": True})).active() is None
    assert BackgroundSteps(module(lora={"shared_base": False})).active() is not None
