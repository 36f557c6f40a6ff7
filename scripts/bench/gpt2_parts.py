# PyTorch's side of scripts/bench/gpt2_parts (see gpt2_parts.lua): the
# same pieces of a GPT-2 124M step, forward and backward, ms per call.
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from timing import gpu_ms, row  # noqa: E402

if not torch.cuda.is_available():
    print("no_gpu")
    sys.exit(0)
d, B, L, C, H, V = "cuda", 16, 1024, 768, 12, 50304
print(f"version PyTorch {torch.__version__} on {torch.cuda.get_device_name(0)}")
torch.manual_seed(0)
x = torch.randn(B, L, C, device=d, requires_grad=True)


def fwd_bwd(f):
    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = f()
        y.float().sum().backward()
    return gpu_ms(step)


ln = nn.LayerNorm(C).to(d)
row("layer_norm", lambda: fwd_bwd(lambda: ln(x)))
qkv = nn.Linear(C, 3 * C).to(d)
row("linear_qkv", lambda: fwd_bwd(lambda: qkv(x)))
fc, proj = nn.Linear(C, 4 * C).to(d), nn.Linear(4 * C, C).to(d)
row("mlp", lambda: fwd_bwd(lambda: proj(F.gelu(fc(x), approximate="tanh"))))
q = torch.randn(B, H, L, C // H, device=d, dtype=torch.bfloat16, requires_grad=True)
row("attention", lambda: gpu_ms(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True).float().sum().backward()))
head = nn.Linear(C, V, bias=False).to(d)
y = torch.randint(0, V, (B * L,), device=d)


def head_loss():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(head(x).view(-1, V), y)
    loss.backward()


row("head_loss", lambda: gpu_ms(head_loss))
g = torch.randn(124 * 1000 * 1000, device=d)
row("grad_norm_124M", lambda: gpu_ms(lambda: torch.linalg.vector_norm(g)))
row("sum_124M", lambda: gpu_ms(lambda: g.sum()))
row("square_124M", lambda: gpu_ms(lambda: g.square()))
row("scale_124M", lambda: gpu_ms(lambda: g.mul_(1.0)))
