# scripts/bench/attention.py: attention.lua's measurements on PyTorch's
# F.scaled_dot_product_attention (its flash kernel for these shapes).
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    print("no_gpu", flush=True)
    raise SystemExit(0)
print(f"version PyTorch {torch.__version__} on {torch.cuda.get_device_name()}", flush=True)


def row(name, f):
    try:
        print(f"{name} {f():.3f}", flush=True)
    except Exception as e:  # a failed row says why and the others go on
        print(f"{name} error: {' | '.join(str(e).split(chr(10)))}", flush=True)


def gpu_ms(f):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        f()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / 10


for B, L in ((16, 1024), (4, 4096)):
    q, k, v = (torch.randn(B, 12, L, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn(B, 12, L, 64, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwdbwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(dout)

    row(f"fwd_{L}", lambda: gpu_ms(fwd))
    row(f"fwdbwd_{L}", lambda: gpu_ms(fwdbwd))
