"""Stage 1, the teacher: all-MiniLM-L6-v2 plus residual context/reply heads,
tuned on (last 3 turns joined with [SEP], next turn) pairs with in-batch
negatives (ConveRT, Dialog-BERT), one full pass over the train pairs."""

from __future__ import annotations

from pathlib import Path

import torch

from models.batches import BatchPlan, Tokenise
from models.config import TrainConfig
from models.dataset import TrainPairs
from models.encoder import DualEncoder
from models.loop import run_steps
from models.losses import in_batch_negatives


def optimiser(model: DualEncoder, body_lr: float, head_lr: float, extra: list[torch.nn.Parameter]) -> torch.optim.AdamW:
    """The body at body_lr; the residual heads and any `extra` (a poly head) at head_lr."""
    heads = [p for h in (model.context_head, model.reply_head) if h is not None for p in h.parameters()] + extra
    head_ids = {id(p) for p in heads}
    body = [p for p in model.parameters() if id(p) not in head_ids]
    return torch.optim.AdamW([{"params": body, "lr": body_lr}, {"params": heads, "lr": head_lr}], weight_decay=0.01)


def train_teacher(
    model: DualEncoder, pairs: TrainPairs, tok: Tokenise, cfg: TrainConfig, checkpoint: Path, device: str
) -> dict[str, float]:
    if model.context_head is None:
        model.add_heads()
    model.to(device)
    plan = BatchPlan(pairs.reply_keys, pairs.lengths, cfg.batch_size, cfg.length_group, cfg.seed)
    steps = plan.steps(cfg.teacher_epochs) if not cfg.max_steps else min(cfg.max_steps, plan.steps(cfg.teacher_epochs))

    def batch_loss(step: int) -> torch.Tensor:
        contexts, replies = pairs.rows(plan.batch(step))
        context = model.encode_context(*(t.to(device) for t in tok.contexts(contexts)))  # [B, D]
        reply = model.encode_reply(*(t.to(device) for t in tok.replies(replies)))  # [B, D]
        return in_batch_negatives(context, reply, cfg.scale)

    torch.manual_seed(cfg.seed)
    opt = optimiser(model, cfg.teacher_lr, cfg.head_lr, [])
    stats = run_steps(
        "teacher", {"model": model}, opt, steps, cfg.warmup_fraction, batch_loss, checkpoint, cfg.checkpoint_every
    )
    return {**stats, "epochs": round(steps / plan.per_epoch, 3), "pairs": len(pairs)}
