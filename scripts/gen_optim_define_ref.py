#!/usr/bin/python3
"""Writes tests/ref/optim_define.lua: parameters after three steps of
RMSprop, Adagrad, Adadelta, Adamax, RAdam, ASGD and Rprop (every option),
and of these and SGD, Adam and AdamW with maximize,
with fixed gradients, as PyTorch computes them in float64, and of NAdam
as PyTorch 2 computes it (see nadam()), for tests/lua/test_optim_define.lua;
ten steps of RAdam and NAdam (`long`); and
the same for Lion (Chen et al. 2023), which torch 1.13 lacks, written out
here by its published update rule, to check an optimizer defined in Lua
with torch.optim.define. The parameters, gradients and steps are those of
scripts/gen_optim_reference.py. `bf16` holds the same steps of bfloat16
parameters as dplua takes them: each step in float32 on float copies of
the bfloat16 parameters, gradients and state, each stored value rounded
back to bfloat16.
    /usr/bin/python3 scripts/gen_optim_define_ref.py > tests/ref/optim_define.lua
"""
import warnings

import torch
from torch.optim import ASGD, LBFGS, SGD, Adadelta, Adagrad, Adam, Adamax, AdamW, RAdam, RMSprop, Rprop

from gen_optim_reference import GRADS, P0, lua, print_runs

warnings.filterwarnings("ignore")
torch.set_default_dtype(torch.float64)


def lion(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
    def make(ps):
        m = [torch.zeros_like(p) for p in ps]

        class Lion:
            def step(self):
                with torch.no_grad():
                    for p, mi in zip(ps, m):
                        if p.grad is None:
                            continue
                        p.mul_(1 - lr * weight_decay)
                        p.add_(torch.sign(mi * betas[0] + p.grad * (1 - betas[0])), alpha=-lr)
                        mi.mul_(betas[1]).add_(p.grad, alpha=1 - betas[1])
        return Lion()
    return make


def nadam(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3):
    """NAdam as PyTorch 2 steps it: this torch's multiplies the next step's
    momentum product by mu twice (mu_product * mu * mu_next), which
    PyTorch 2.0 corrected to mu_product * mu_next."""
    def make(ps):
        state = [{"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p), "mu_product": 1.0, "step": 0}
                 for p in ps]

        class NAdam:
            def step(self):
                b1, b2 = betas
                with torch.no_grad():
                    for p, st in zip(ps, state):
                        if p.grad is None:
                            continue
                        st["step"] += 1
                        t = st["step"]
                        grad = p.grad + weight_decay * p
                        mu = b1 * (1 - 0.5 * 0.96 ** (t * momentum_decay))
                        mu_next = b1 * (1 - 0.5 * 0.96 ** ((t + 1) * momentum_decay))
                        st["mu_product"] *= mu
                        st["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
                        st["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
                        denom = (st["exp_avg_sq"] / (1 - b2 ** t)).sqrt() + eps
                        p.addcdiv_(grad, denom, value=-lr * (1 - mu) / (1 - st["mu_product"]))
                        p.addcdiv_(st["exp_avg"], denom, value=-lr * mu_next / (1 - st["mu_product"] * mu_next))
        return NAdam()
    return make


cases = {
    "adamax": lambda ps: Adamax(ps, lr=0.1),
    "adamax_all": lambda ps: Adamax(ps, lr=0.05, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.1),
    "nadam": nadam(lr=0.1),
    "nadam_all": nadam(lr=0.05, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.1, momentum_decay=0.01),
    "radam": lambda ps: RAdam(ps, lr=0.1),
    "radam_all": lambda ps: RAdam(ps, lr=0.05, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.1),
    "asgd": lambda ps: ASGD(ps, lr=0.1),
    "asgd_all": lambda ps: ASGD(ps, lr=0.05, lambd=0.1, alpha=0.5, t0=1, weight_decay=0.1),
    "rprop": lambda ps: Rprop(ps, lr=0.1),
    "rprop_all": lambda ps: Rprop(ps, lr=0.05, etas=(0.3, 1.5), step_sizes=(0.02, 0.08)),
    "rmsprop": lambda ps: RMSprop(ps, lr=0.01),
    "rmsprop_momentum_wd": lambda ps: RMSprop(ps, lr=0.02, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.8),
    "rmsprop_centered": lambda ps: RMSprop(ps, lr=0.01, centered=True),
    "rmsprop_centered_momentum": lambda ps: RMSprop(ps, lr=0.01, momentum=0.5, centered=True),
    "rmsprop_all": lambda ps: RMSprop(ps, lr=0.02, alpha=0.9, eps=1e-6, weight_decay=0.1, momentum=0.8,
                                      centered=True),
    "adagrad": lambda ps: Adagrad(ps, lr=0.1),
    "adagrad_all": lambda ps: Adagrad(ps, lr=0.1, lr_decay=0.05, weight_decay=0.2, initial_accumulator_value=0.5,
                                      eps=1e-6),
    "adadelta": lambda ps: Adadelta(ps),
    "adadelta_all": lambda ps: Adadelta(ps, lr=0.5, rho=0.8, eps=1e-4, weight_decay=0.1),
    "lion": lion(lr=0.01, betas=(0.9, 0.99), weight_decay=0.1),
    # maximize: each steps with the gradient negated (weight decay 0.05, which
    # does not cancel the first gradients, P0 / 10)
    "sgd_maximize": lambda ps: SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.05, maximize=True),
    "adam_maximize": lambda ps: Adam(ps, lr=0.1, weight_decay=0.05, amsgrad=True, maximize=True),
    "adamw_maximize": lambda ps: AdamW(ps, lr=0.1, maximize=True),
    "rmsprop_maximize": lambda ps: RMSprop(ps, lr=0.01, momentum=0.5, centered=True, maximize=True),
    "adagrad_maximize": lambda ps: Adagrad(ps, lr=0.1, weight_decay=0.2, maximize=True),
    "adadelta_maximize": lambda ps: Adadelta(ps, lr=0.5, weight_decay=0.05, maximize=True),
    "adamax_maximize": lambda ps: Adamax(ps, lr=0.1, maximize=True),
    "asgd_maximize": lambda ps: ASGD(ps, lr=0.1, weight_decay=0.05, maximize=True),
    "rprop_maximize": lambda ps: Rprop(ps, lr=0.1, maximize=True),
}
missing = {
    "rmsprop_missing": (lambda ps: RMSprop(ps, lr=0.01, momentum=0.9), (1, 0)),
    "adagrad_missing": (lambda ps: Adagrad(ps, lr=0.1, lr_decay=0.1, initial_accumulator_value=0.1), (0, 1)),
    "adadelta_missing": (lambda ps: Adadelta(ps, lr=0.5, rho=0.8, weight_decay=0.1), (1, 1)),
    "nadam_missing": (nadam(lr=0.1, weight_decay=0.1), (1, 0)),
    "rprop_missing": (lambda ps: Rprop(ps, lr=0.1), (0, 1)),
    "adam_maximize_missing": (lambda ps: Adam(ps, lr=0.1, maximize=True), (1, 0)),
    "adagrad_maximize_missing": (lambda ps: Adagrad(ps, lr=0.1, maximize=True), (0, 1)),
}
# RAdam's rectified step needs rho_t > 5, which its defaults reach at the
# sixth step: ten steps, the gradients of GRADS in turn
LONG = {
    "radam_ten_steps": lambda ps: RAdam(ps, lr=0.1),
    "nadam_ten_steps": nadam(lr=0.1),
}


def lbfgs_runs():
    """LBFGS on the Rosenbrock function of (a, b) from (-1.5, 2) and on a
    least-squares fit of a 2x3 weight and a bias: the parameters and the
    evaluations so far after each of four step(closure) calls."""
    X = torch.tensor([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5], [-1.0, 1.0, 1.0], [0.0, 2.0, -1.5]])
    Y = torch.tensor([[1.0, 0.0], [-0.5, 2.0], [0.25, 0.75], [2.0, -1.0]])

    def rosen(ps):
        a, b = ps[0][0], ps[0][1]
        return (1 - a) ** 2 + 100 * (b - a * a) ** 2

    def lsq(ps):
        return ((X @ ps[0].t() + ps[1] - Y) ** 2).sum()

    problems = {"rosen": (rosen, [[-1.5, 2.0]]), "lsq": (lsq, [[[0.1, 0.2, 0.3], [-0.1, 0.0, 0.5]], [0.0, 0.1]])}
    options = {"default": {}, "short_history": {"max_iter": 4, "history_size": 2, "lr": 0.5},
               "strong_wolfe": {"max_iter": 5, "line_search_fn": "strong_wolfe"}}
    out = {}
    for pname, (f, p0) in problems.items():
        for oname, opts in options.items():
            ps = [torch.tensor(p, requires_grad=True) for p in p0]
            opt = LBFGS(ps, **opts)
            steps = []

            def closure():
                opt.zero_grad()
                loss = f(ps)
                loss.backward()
                return loss
            for _ in range(4):
                opt.step(closure)
                steps.append([[p.detach().reshape(-1).tolist() for p in ps], opt.state[ps[0]]["func_evals"]])
            out[pname + "_" + oname] = steps
    return out


def run_long(make, steps=10):
    ps = [torch.tensor(p, requires_grad=True) for p in P0]
    opt = make(ps)
    for k in range(steps):
        for p, g in zip(ps, GRADS[k % len(GRADS)]):
            p.grad = torch.tensor(g)
        opt.step()
    return [p.detach().tolist() for p in ps]


def run_bf16(make):
    """Three steps of bfloat16 parameters (P0 is exact in bfloat16) as dplua
    takes them: float32 steps whose stored values are rounded to bfloat16."""
    def rounded(t):
        return t.bfloat16().float()
    ps = [torch.tensor(p, dtype=torch.float32, requires_grad=True) for p in P0]
    opt = make(ps)
    out = []
    for gs in GRADS:
        for p, g in zip(ps, gs):
            p.grad = rounded(torch.tensor(g))
        opt.step()
        with torch.no_grad():
            for p in ps:
                p.copy_(rounded(p))
                for k, v in opt.state[p].items():
                    if k != "step":
                        v.copy_(rounded(v))
        out.append([p.detach().double().tolist() for p in ps])
    return out


print("-- generated by scripts/gen_optim_define_ref.py with torch " + torch.__version__ + "; do not edit")
print("return {")
print("  p0 = %s," % lua(P0))
print("  grads = %s," % lua(GRADS))
print_runs(cases, missing, "  ")
print("  lbfgs = {")
for name, steps in sorted(lbfgs_runs().items()):
    print("    %s = %s," % (name, lua(steps)))
print("  },")
print("  long = {")
for name in sorted(LONG):
    print("    %s = %s," % (name, lua(run_long(LONG[name]))))
print("  },")
print("  bf16 = {")
for name in sorted(cases):
    if name in ("rmsprop", "rmsprop_momentum_wd", "rmsprop_centered", "rmsprop_centered_momentum", "rmsprop_all",
                "adagrad", "adagrad_all", "adadelta", "adadelta_all"):
        print("    %s = %s," % (name, lua(run_bf16(cases[name]))))
print("  },")
print("}")
