"""The optimisation loop every stage shares: a fixed number of steps, warmup
then linear decay, a progress bar, and a checkpoint every few steps that a
rerun resumes from.

A checkpoint holds the modules, the optimiser, the step and torch's random
state (dropout), and the batch order is a function of the step
(`models/batches.py`), so a resumed run continues the same run: the weights
after a crash and a resume are the weights it would have had.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from core.files import atomic_file

BUDGET_PROBE = 20  # steps timed before a budgeted run sets its total
# ... after these, which a GPU spends on kernel selection and memory pools: timed
# with them, the first 20 steps of an H100 run read twice the steady rate.
BUDGET_WARMUP = 5


def lr_factor(step: int, total: int, warmup_fraction: float) -> float:
    """Linear warmup over the first `warmup_fraction` of steps, then linear decay to 0."""
    warmup = max(1, round(total * warmup_fraction))
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """A crash while saving leaves the previous checkpoint, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "wb") as f:
        torch.save(state, f)


def run_steps(
    name: str,
    modules: dict[str, nn.Module],
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_fraction: float,
    batch_loss: Callable[[int], torch.Tensor],
    checkpoint: Path,
    every: int,
    budget_s: float | None = None,
    probed_total: int | None = None,
) -> dict[str, float]:
    """Optimises batch_loss(step) for steps [resumed step, total_steps); returns the stage's figures.

    With `budget_s`, `BUDGET_PROBE` steps after the first few time a step and the total
    shrinks to what fits the budget: on a lent GPU the steps a run gets are
    bounded by the minutes it holds the machine, not by a count set ahead. The
    schedule then warms up and decays over the shrunk total, which is
    checkpointed, so a resume keeps it.

    With `probed_total` too, the probe is not timed: the total shrinks to that
    recorded figure at the same step. A rebuild of a budgeted run then follows its
    schedule (warmup and decay over the original total until the probe, over
    the shrunk one after) on any machine, however fast.
    """
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    step, seconds, losses = 0, 0.0, []
    if checkpoint.is_file():
        state = torch.load(checkpoint, weights_only=False)
        for key, module in modules.items():
            module.load_state_dict(state["modules"][key])
        optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        step, seconds, losses = state["step"], state["seconds"], state["losses"]
        total_steps = state.get("total_steps", total_steps)
        print(f"[{name}] resuming at step {step}/{total_steps}", file=sys.stderr, flush=True)
    resumed_from = step

    def save() -> None:
        state = {
            "step": step,
            "seconds": seconds + time.perf_counter() - started,
            "losses": losses,
            "modules": {key: module.state_dict() for key, module in modules.items()},
            "optimizer": optimizer.state_dict(),
            "rng": torch.get_rng_state(),
            "total_steps": total_steps,
        }
        save_atomic(state, checkpoint)

    for module in modules.values():
        module.train()
    started = probe_started = time.perf_counter()
    bar = tqdm(total=total_steps, initial=step, desc=name, unit="step", file=sys.stderr)
    while step < total_steps:
        factor = lr_factor(step, total_steps, warmup_fraction)
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"] * factor
        loss = batch_loss(step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(round(loss.item(), 5))
        step += 1
        bar.update(1)
        if step == resumed_from + BUDGET_WARMUP:
            probe_started = time.perf_counter()
        if budget_s is not None and step == resumed_from + BUDGET_WARMUP + BUDGET_PROBE:
            if probed_total is not None:
                fits, found = probed_total, "the recorded probe"
            else:
                per_step = (time.perf_counter() - probe_started) / BUDGET_PROBE
                fits = step + int((budget_s - (time.perf_counter() - started)) / per_step)
                found = f"{per_step * 1000:.0f} ms a step"
            if fits < total_steps:
                cut = f"{found}: {fits} of {total_steps} steps fit {budget_s:.0f} s"
                print(f"[{name}] {cut}", file=sys.stderr, flush=True)
                total_steps = max(step, fits)
                bar.total = total_steps
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if step % every == 0 or step == total_steps:
            save()
    bar.close()
    for module in modules.values():
        module.eval()
    seconds += time.perf_counter() - started
    head, tail = losses[:20] or [float("nan")], losses[-20:] or [float("nan")]
    stats = {
        "steps": step,
        "seconds": round(seconds, 1),
        "first_loss": round(sum(head) / len(head), 4),
        "final_loss": round(sum(tail) / len(tail), 4),
        "resumed_from_step": resumed_from,
    }
    print(f"[{name}] {stats}", file=sys.stderr, flush=True)
    return stats
