"""A quick 1-of-100 check in torch after a stage, on validation examples.

The release figures come from `make eval` on the exported ONNX bundles and
the test split; this only tells a training run how a stage went.
"""

from __future__ import annotations

import numpy as np
import torch

from models.batches import Tokenise
from models.dataset import TURN_SEPARATOR
from models.encoder import DualEncoder
from models.evalset import EvalSet, ranks, reranked_ranks
from models.poly import rescore

CHUNK = 128


@torch.inference_mode()
def validate(
    model: DualEncoder,
    tok: Tokenise,
    data: EvalSet,
    turns: int,
    depth: int,
    separator: str = TURN_SEPARATOR,
    prefixes: tuple[str, str] = ("", ""),
) -> dict[str, float]:
    """R@1 of the bi-encoder, and after the poly rerank of its top `depth` when the model has a head.

    prefixes: what the bundle puts before a context and before a reply (E5's "query: ", "passage: ")."""
    model.eval()
    device = next(model.parameters()).device
    joined = [prefixes[0] + c for c in data.joined(separator, turns)]
    reply_texts = [prefixes[1] + r for r in data.replies]
    contexts, replies, polys = [], [], []
    for start in range(0, len(joined), CHUNK):
        ids, mask = (t.to(device) for t in tok.contexts(joined[start : start + CHUNK]))
        outputs = model(ids, mask)  # ([b, D] context, [b, D] reply, [b, m, D] poly?)
        contexts.append(outputs[0].cpu())
        if len(outputs) > 2:
            polys.append(outputs[2].cpu())
        replies.append(
            model.encode_reply(*(t.to(device) for t in tok.replies(reply_texts[start : start + CHUNK]))).cpu()
        )
    context, reply = torch.cat(contexts), torch.cat(replies)  # [N, D] each
    figures = {"r_at_1": round(float((ranks(context.numpy(), reply.numpy(), data.negatives) == 1).mean()), 4)}
    if polys and model.poly_head is not None:
        candidates = torch.from_numpy(data.candidates)  # [N, 100]
        candidate_replies = reply[candidates]  # [N, 100, D]
        bi = torch.einsum("nd,ncd->nc", context, candidate_replies)  # [N, 100]
        final = rescore(model.poly_head.cpu(), bi, torch.cat(polys), candidate_replies)  # [N, 100]
        model.poly_head.to(device)
        rank = reranked_ranks(bi.numpy(), final.numpy(), depth)
        figures["rerank_r_at_1"] = round(float(np.mean(rank == 1)), 4)
    return figures
