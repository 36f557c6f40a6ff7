# scripts/bench/attention.py: attention.lua's measurements on PyTorch's
# F.scaled_dot_product_attention (its flash kernel for these shapes).
import torch
import torch.nn.functional as F
from timing import gpu_ms, row

if not torch.cuda.is_available():
    print("no_gpu", flush=True)
    raise SystemExit(0)
print(f"version PyTorch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)


for B, L, D in ((16, 1024, 64), (4, 4096, 64), (8, 2048, 128)):
    q, k, v = (torch.randn(B, 12, L, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, 12, L, D, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwdbwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)

    row(f"fwd_{L}_{D}", lambda: 1000 * gpu_ms(fwd, 10), 1)
    row(f"fwdbwd_{L}_{D}", lambda: 1000 * gpu_ms(fwdbwd, 10), 1)
