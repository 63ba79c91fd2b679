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


def _resume(
    name: str, checkpoint: Path, modules: dict[str, nn.Module], optimizer: torch.optim.Optimizer, total_steps: int
) -> tuple[int, float, list[float], int]:
    """(step, seconds, losses, total steps) of the run `checkpoint` holds, its modules, optimiser and
    random state loaded; a fresh start's without one."""
    if not checkpoint.is_file():
        return 0, 0.0, [], total_steps
    state = torch.load(checkpoint, weights_only=False)
    for key, module in modules.items():
        module.load_state_dict(state["modules"][key])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    total_steps = state.get("total_steps", total_steps)
    print(f"[{name}] resuming at step {state['step']}/{total_steps}", file=sys.stderr, flush=True)
    return state["step"], state["seconds"], state["losses"], total_steps


def _save(
    checkpoint: Path,
    modules: dict[str, nn.Module],
    optimizer: torch.optim.Optimizer,
    step: int,
    seconds: float,
    losses: list[float],
    total_steps: int,
) -> None:
    state = {
        "step": step,
        "seconds": seconds,
        "losses": losses,
        "modules": {key: module.state_dict() for key, module in modules.items()},
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "total_steps": total_steps,
    }
    save_atomic(state, checkpoint)


def _budgeted_total(
    name: str,
    step: int,
    total_steps: int,
    budget_s: float,
    probe_s: float,
    elapsed_s: float,
    probed_total: int | None,
) -> int:
    """The total once the budget probe is done: the steps that fit `budget_s`, from `probe_s` over
    the `BUDGET_PROBE` steps and the `elapsed_s` so far, or the `probed_total` recorded; never fewer
    than those taken, never more than `total_steps`."""
    if probed_total is not None:
        fits, found = probed_total, "the recorded probe"
    else:
        per_step = probe_s / BUDGET_PROBE
        fits = step + int((budget_s - elapsed_s) / per_step)
        found = f"{per_step * 1000:.0f} ms a step"
    if fits >= total_steps:
        return total_steps
    print(f"[{name}] {found}: {fits} of {total_steps} steps fit {budget_s:.0f} s", file=sys.stderr, flush=True)
    return max(step, fits)


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
    on_checkpoint: Callable[[int], None] | None = None,
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

    `on_checkpoint(step)` runs after each checkpoint is written (a curve's point, say); its time
    is not the budget's.
    """
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    step, seconds, losses, total_steps = _resume(name, checkpoint, modules, optimizer, total_steps)
    resumed_from = step

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
            probe_s = time.perf_counter() - probe_started
            total_steps = _budgeted_total(
                name, step, total_steps, budget_s, probe_s, time.perf_counter() - started, probed_total
            )
            bar.total = total_steps
        bar.set_postfix(loss=f"{sum(losses[-20:]) / len(losses[-20:]):.3f}")
        if step % every == 0 or step == total_steps:
            elapsed = seconds + time.perf_counter() - started
            _save(checkpoint, modules, optimizer, step, elapsed, losses, total_steps)
            if on_checkpoint is not None:
                paused = time.perf_counter()
                on_checkpoint(step)
                started += time.perf_counter() - paused
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
