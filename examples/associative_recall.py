"""A tiny language model built from `DGPSLayer`s, trained on multi-query associative recall (MQAR).

Each sequence lists `n_pairs` key-value pairs (distinct keys) and then `n_queries` keys drawn from them;
at each query the model must output that key's value. Without a working token mixer the best a model
can do is guess uniformly among the values, a loss of log(n_values); recall drives it towards 0.

    python examples/associative_recall.py --spec specs/gdn.dgps --steps 300
    python examples/associative_recall.py --spec specs/cler_h_gdn.dgps --backend reference

`--backend auto` (the default) trains on the generated kernels when a GPU is present and, without one, on
the spec's sequential reference in place of the kernels (the layer around it is identical): on a CPU the
kernels run under Triton's interpreter, about 40 s a step, while the reference trains 300 steps in a few
minutes. `--backend kernel` forces the kernels.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from dgps.runtime.layers import DGPSLayer  # without a GPU, importing the runtime selects Triton's interpreter

SPEC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "specs")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, spec: str, d: int, heads: int, head_dim: int, layer_idx: int, backend: str) -> None:
        super().__init__()
        self.mixer_norm = RMSNorm(d)
        self.mixer = DGPSLayer(spec, d, heads, head_dim, head_dim, layer_idx=layer_idx, backend=backend)
        self.mlp_norm = RMSNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d, bias=False), nn.GELU(), nn.Linear(2 * d, d, bias=False))

    def forward(self, x: torch.Tensor, cler_in: torch.Tensor | None = None):  # noqa: ANN201
        y, _, extras = self.mixer(self.mixer_norm(x), cler_in=cler_in)
        x = x + y
        x = x + self.mlp(self.mlp_norm(x))
        return x, extras


class RecallModel(nn.Module):
    """Embedding, DGPS blocks, final norm, LM head. CLER residuals go to the next routable layer."""

    def __init__(self, spec: str, vocab: int, d: int = 64, n_layers: int = 2, heads: int = 2, head_dim: int = 16,
                 backend: str = "kernel") -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(spec, d, heads, head_dim, i, backend) for i in range(n_layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        cler = None  # the write residual of the nearest lower layer with `route residual`
        for block in self.blocks:
            routable = block.mixer.route == "residual"
            x, extras = block(x, cler_in=cler if routable else None)
            if routable:
                cler = extras["cler"]
        return self.lm_head(self.norm(x))


def make_batch(batch: int, n_pairs: int, n_queries: int, n_keys: int, n_values: int,
               gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, 2·n_pairs + n_queries] and labels (-100 except at the queries). Keys are tokens
    0..n_keys-1, values n_keys..n_keys+n_values-1."""
    keys = torch.argsort(torch.rand(batch, n_keys, generator=gen), dim=1)[:, :n_pairs]
    values = n_keys + torch.randint(0, n_values, (batch, n_pairs), generator=gen)
    pairs = torch.stack([keys, values], dim=2).reshape(batch, 2 * n_pairs)
    which = torch.randint(0, n_pairs, (batch, n_queries), generator=gen)
    ids = torch.cat([pairs, keys.gather(1, which)], dim=1)
    labels = torch.full_like(ids, -100)
    labels[:, 2 * n_pairs:] = values.gather(1, which)
    return ids, labels


def main(spec: str = "specs/gdn.dgps", steps: int = 300, seed: int = 0, backend: str = "kernel", batch: int = 32,
         n_pairs: int = 4, n_queries: int = 8, n_keys: int = 8, n_values: int = 8, d: int = 64, n_layers: int = 2,
         heads: int = 2, head_dim: int = 16, lr: float = 1e-2, log_every: int = 25, verbose: bool = True,
         model_hook=None) -> list[float]:  # noqa: ANN001
    """Train on MQAR; return the loss of every step. `model_hook(model)` may alter the model before training."""
    if not os.path.exists(spec) and os.path.exists(os.path.join(SPEC_DIR, os.path.basename(spec))):
        spec = os.path.join(SPEC_DIR, os.path.basename(spec))
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = RecallModel(spec, n_keys + n_values, d, n_layers, heads, head_dim, backend)
    if model_hook is not None:
        model_hook(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))
    losses: list[float] = []
    start = time.time()
    for step in range(steps):
        ids, labels = make_batch(batch, n_pairs, n_queries, n_keys, n_values, gen)
        logits = model(ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if verbose and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}  ({time.time() - start:.1f}s)", flush=True)
    if verbose:
        print(f"no-recall floor log(n_values) = {math.log(n_values):.4f}; "
              f"first-20 mean {sum(losses[:20]) / min(20, len(losses)):.4f}, "
              f"last-20 mean {sum(losses[-20:]) / min(20, len(losses)):.4f}")
    return losses


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", default="specs/gdn.dgps")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=("auto", "kernel", "reference"), default="auto")
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    backend = args.backend
    if backend == "auto":
        backend = "kernel" if torch.cuda.is_available() else "reference"
        why = "a GPU is present" if backend == "kernel" else \
            "no GPU: the kernels would run under Triton's interpreter, ~40 s a step; --backend kernel forces them"
        print(f"backend: {backend} ({why})", flush=True)
    main(args.spec, steps=args.steps, seed=args.seed, backend=backend, batch=args.batch)
