"""A quick 1-of-100 check in torch after a stage, on validation examples.

The release figures come from `make eval` on the exported ONNX bundles and
the test split; this only tells a training run how a stage went.
"""

from __future__ import annotations

import torch

from models.batches import Tokenise
from models.dataset import TURN_SEPARATOR
from models.encoder import DualEncoder
from models.evalset import EvalSet, ranks

CHUNK = 128


@torch.inference_mode()
def validate(
    model: DualEncoder,
    tok: Tokenise,
    data: EvalSet,
    turns: int,
    separator: str = TURN_SEPARATOR,
    prefixes: tuple[str, str] = ("", ""),
) -> dict[str, float]:
    """R@1 of the bi-encoder.

    prefixes: what the bundle puts before a context and before a reply (E5's "query: ", "passage: ")."""
    model.eval()
    device = next(model.parameters()).device
    joined = [prefixes[0] + c for c in data.joined(separator, turns)]
    reply_texts = [prefixes[1] + r for r in data.replies]
    contexts, replies = [], []
    for start in range(0, len(joined), CHUNK):
        ids, mask = (t.to(device) for t in tok.contexts(joined[start : start + CHUNK]))
        contexts.append(model.encode_context(ids, mask).cpu())  # [b, D]
        replies.append(
            model.encode_reply(*(t.to(device) for t in tok.replies(reply_texts[start : start + CHUNK]))).cpu()
        )
    context, reply = torch.cat(contexts), torch.cat(replies)  # [N, D] each
    return {"r_at_1": round(float((ranks(context.numpy(), reply.numpy(), data.negatives) == 1).mean()), 4)}


@torch.inference_mode()
def encode(model: DualEncoder, tok: Tokenise, texts: list[str], side: str) -> torch.Tensor:
    """[N, D] unit vectors of one side, in chunks, on the model's device."""
    device = next(model.parameters()).device
    batches = tok.contexts if side == "context" else tok.replies
    run = model.encode_context if side == "context" else model.encode_reply
    return torch.cat(
        [run(*(t.to(device) for t in batches(texts[i : i + CHUNK]))).float() for i in range(0, len(texts), CHUNK)]
    )


def dev_half_a(
    model: DualEncoder, tok: Tokenise, sets: dict[str, dict[str, list]], prefixes: tuple[str, str]
) -> dict[str, float]:
    """R@1 over every distinct reply of each human dev set, on its half A (models/e5/pack.py):
    what a choice between variants is made on. The served figure comes through the live API."""
    model.eval()
    result = {}
    for name, data in sets.items():
        contexts = encode(model, tok, [prefixes[0] + c for c in data["contexts"]], "context")  # [C, D]
        replies = encode(model, tok, [prefixes[1] + r for r in data["replies"]], "reply")  # [N, D]
        top = (contexts @ replies.T).argmax(dim=1).tolist()  # [C]
        result[name] = round(sum(t in gold for t, gold in zip(top, data["gold"], strict=True)) / len(top), 4)
    return result
