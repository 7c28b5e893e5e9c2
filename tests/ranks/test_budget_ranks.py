"""A time budget on two gloo ranks: rank 0's clock decides, every rank takes the same steps at the same learning
rates and stops at the same step."""
import json

import pytest

from tests.support.bounds import bound
from tests.support.ranks import start_two_ranks

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = r"""
import itertools, json, os, sys
import torch
from accelerate import Accelerator
from utils.optim import build_scheduler
from utils.run.budget import TimeBudget
from utils.run.preemption import StopRequest, StopVote

accelerator = Accelerator(cpu=True)
rank = accelerator.process_index
ticks = itertools.count()  # rank 0's clock moves 0.1 s at each reading, whatever the box's load
budget = TimeBudget(10.0, "--time-budget 10", started=0.0, clock=lambda: next(ticks) * 0.1)
if rank == 0:
    budget.start_training()  # rank 0's clock alone: the trainer opens the window there (rank0_decides)
model = accelerator.prepare(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sched = build_scheduler(opt, 5, 10, 0.1, "wsd", 0.5, progress=lambda: budget.progress)
# Rank 1 offers a reading that says the budget is over: only rank 0's may count.
vote = StopVote(StopRequest(5), accelerator, progress=budget.progress_at if rank == 0 else lambda: 1.0)
lrs, step = [], 0
while True:
    stopping = vote()
    model(torch.ones(8, 4) * (rank + 1)).sum().backward()  # DDP averages the gradients: a collective per step
    opt.step(); opt.zero_grad()
    step += 1
    budget.progress = vote.progress
    sched.step()
    lrs.append(opt.param_groups[0]["lr"])
    if budget.progress >= 1.0 or stopping:
        break
vote.close()
weights = [round(v, 8) for v in model.module.weight.flatten().tolist()]
sys.stdout.write(json.dumps({"rank": rank, "steps": step, "lrs": lrs, "weights": weights,
                             "progress": budget.progress}) + "\n")
sys.stdout.flush()
accelerator.wait_for_everyone()
torch.distributed.destroy_process_group()
# What this checks is said; the interpreter's own teardown of gloo's threads is not what it tests, and on a loaded
# box it once aborted there ("terminate called without an active exception") after the report was written.
os._exit(0)
"""


def test_two_ranks_stop_at_the_same_step_with_the_same_learning_rates():
    procs = start_two_ranks(SCRIPT)
    outs = [p.communicate(timeout=bound(150)) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    r0, r1 = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in outs), key=lambda r: r["rank"])
    assert r0["steps"] == r1["steps"] > 50  # rank 1 did not stop at once: its reading did not count
    assert r0["lrs"] == r1["lrs"] and r0["weights"] == r1["weights"]
    assert r0["progress"] == r1["progress"] == 1.0
    assert r0["lrs"][-1] == pytest.approx(0.1 * 0.1)  # the decay reached the floor at the budget's end
    assert max(r0["lrs"]) == pytest.approx(0.1)
