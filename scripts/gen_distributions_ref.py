#!/usr/bin/python3
"""Writes tests/ref/distributions.lua: PyTorch's log_prob, entropy, mean,
variance and kl_divergence of torch.distributions' Normal, Categorical,
Bernoulli, Uniform and Independent, and the parameters' gradients of
sum(log_prob * cos(k)) + sum(entropy), for tests/lua/test_distributions.lua,
in float64. Parameters and values are the lists below.
    cd scripts && /usr/bin/python3 gen_distributions_ref.py > ../tests/ref/distributions.lua
"""
import math

import torch
import torch.distributions as D
from reflua import lua, print_cases

T = lambda v: torch.tensor(v, dtype=torch.float64)
CASES = {
    # name: (class, params as keyword arguments, the value for log_prob)
    "normal": (D.Normal, {"loc": [0.5, -1.0, 2.0], "scale": [1.5, 0.25, 3.0]}, [0.0, -0.75, 4.5]),
    "normal_broadcast": (D.Normal, {"loc": [[0.5], [-1.0]], "scale": [1.0, 2.0, 0.5]}, [[0.0, 1.0, 2.0], [-1.0, 0.5, 3.0]]),
    "categorical_logits": (D.Categorical, {"logits": [[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, -3.0, 0.25]]}, [2, 3]),
    "categorical_probs": (D.Categorical, {"probs": [[0.2, 0.0, 0.5, 0.3], [1.0, 1.0, 2.0, 4.0]]}, [3, 0]),
    "bernoulli_probs": (D.Bernoulli, {"probs": [0.1, 0.5, 0.9, 0.3]}, [1.0, 0.0, 1.0, 0.0]),
    "bernoulli_logits": (D.Bernoulli, {"logits": [-2.0, 0.0, 3.5]}, [0.0, 1.0, 1.0]),
    "uniform": (D.Uniform, {"low": [0.0, -2.0, 1.0], "high": [1.0, 3.0, 1.5]}, [0.25, 2.5, 1.25]),
}


def build(cls, params, grad):
    ps = {k: T(v).requires_grad_(grad) for k, v in params.items()}
    return cls(**ps), ps


cases = {}
for name, (cls, params, value) in CASES.items():
    d, ps = build(cls, params, True)
    v = torch.tensor(value, dtype=torch.int64 if cls is D.Categorical else torch.float64)
    lp = d.log_prob(v)
    ent = d.entropy()
    w = torch.cos(torch.arange(lp.numel(), dtype=torch.float64)).reshape(lp.shape)
    finite = torch.isfinite(lp)
    (torch.where(finite, lp, torch.zeros_like(lp)) * w).sum().backward(retain_graph=True)
    ent.sum().backward()
    c = {"log_prob": lp.detach().reshape(-1).tolist(), "entropy": ent.detach().reshape(-1).tolist()}
    if cls is not D.Categorical:
        c["mean"] = d.mean.detach().reshape(-1).tolist()
        c["variance"] = d.variance.detach().reshape(-1).tolist()
    for k, p in ps.items():
        c["d_" + k] = p.grad.reshape(-1).tolist()
    # the kl from this distribution to one of its parameters shifted
    p2, _ = build(cls, {k: [[x * 0.8 + 0.1 for x in row] if isinstance(row, list) else row * 0.8 + 0.1 for row in v]
                        if k not in ("low", "high") else [x - 0.5 if k == "low" else x + 0.5 for x in v]
                        for k, v in params.items()}, False)
    c["kl"] = D.kl_divergence(d, p2).detach().reshape(-1).tolist()
    cases[name] = c

cdf = D.Normal(T([0.5, -1.0, 2.0]), T([1.5, 0.25, 3.0])).cdf(T([0.0, -0.75, 4.5]))
cases["normal_cdf"] = {"cdf": cdf.tolist()}

normal = D.Normal(T([[0.5, 1.0], [-1.0, 2.0]]), T([[1.0, 2.0], [0.5, 1.5]]))
ind = D.Independent(normal, 1)
cases["independent_normal"] = {
    "log_prob": ind.log_prob(T([[0.0, 1.0], [1.0, 1.0]])).reshape(-1).tolist(),
    "entropy": ind.entropy().reshape(-1).tolist(),
    "kl": D.kl_divergence(ind, D.Independent(D.Normal(T([[0.0, 0.0], [0.0, 0.0]]), T([[1.0, 1.0], [1.0, 1.0]])), 1))
    .reshape(-1).tolist(),
}
print_cases("gen_distributions_ref.py", cases, lua)
