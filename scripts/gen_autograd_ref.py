#!/usr/bin/python3
"""Writes tests/ref/autograd.lua: PyTorch's results for custom
autograd.Functions, torch.autograd.grad, tensor hooks, module hooks and
the state_dict names of ParameterList and ParameterDict, and
torch.autograd.functional's jacobian, vjp and jvp, for
tests/lua/test_autograd_ext.lua. Inputs are fixed formulas (no RNG), so
the test rebuilds them.

    /usr/bin/python3 scripts/gen_autograd_ref.py > tests/ref/autograd.lua
"""
import math

import torch
import torch.nn as nn

from reflua import print_cases

torch.set_default_dtype(torch.float64)


def lua(v):
    if isinstance(v, torch.Tensor):
        return lua(v.detach().flatten().tolist())
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, (list, tuple)):
        return "{" + ", ".join(lua(x) for x in v) + "}"
    if isinstance(v, bool):
        return "true" if v else "false"
    return "%.17g" % v


def filled(shape, f):
    """The tensor whose flat element i is f(i) (tests/lua/tap.lua's T.filled)."""
    n = math.prod(shape)
    return torch.tensor([f(i) for i in range(n)]).reshape(shape)


def x_of():
    return filled((2, 3), lambda i: 0.3 * i - 0.7).requires_grad_()


def w_of():
    return filled((3, 2), lambda i: math.sin(i + 1)).requires_grad_()


cases = {}


class MulAdd(torch.autograd.Function):
    """Two results from two tensors and a number."""

    @staticmethod
    def forward(ctx, a, b, k):
        ctx.save_for_backward(a, b)
        ctx.k = k
        return a * b * k, a + b

    @staticmethod
    def backward(ctx, g1, g2):
        a, b = ctx.saved_tensors
        return g1 * b * ctx.k + g2, g1 * a * ctx.k + g2, None


def function_case():
    a = x_of()
    b = filled((2, 3), lambda i: math.cos(i)).requires_grad_()
    p, s = MulAdd.apply(a, b, 3.0)
    loss = (p * s).sum() + (s * s).sum()
    loss.backward()
    return {"p": p, "s": s, "a_grad": a.grad, "b_grad": b.grad}


cases["function_two_outputs"] = function_case()


def grad_case():
    x, w = x_of(), w_of()
    y = (x @ w).tanh()
    z = (y * y).sum() + (x * x).sum()
    gx, gw, gy = torch.autograd.grad(z, [x, w, y], retain_graph=True)
    go = filled((2, 2), lambda i: 0.5 + i)
    gx2, = torch.autograd.grad(y, x, grad_outputs=go)
    return {"gx": gx, "gw": gw, "gy": gy, "gx_go": gx2}


cases["grad"] = grad_case()


def grad_two_outputs():
    x, w = x_of(), w_of()
    y = x @ w
    a, b = y.sin().sum(), (y * y).mean()
    gx, gw = torch.autograd.grad([a, b], [x, w], grad_outputs=[torch.tensor(2.0), torch.tensor(-1.0)])
    return {"gx": gx, "gw": gw}


cases["grad_two_outputs"] = grad_two_outputs()


def backward_several():
    """torch.autograd.backward from two roots, one weighted; then with inputs."""
    x, w = x_of(), w_of()
    y = x @ w
    go = filled((2, 2), lambda i: 0.5 + i)
    torch.autograd.backward([y.sin().sum(), y * y], [None, go])
    out = {"gx": x.grad.clone(), "gw": w.grad.clone()}
    torch.autograd.backward([(x @ w).exp().sum()], inputs=[w])
    out["gx_after"], out["gw_after"] = x.grad, w.grad
    return out


cases["backward_several"] = backward_several()


def tensor_hooks():
    x, w = x_of(), w_of()
    seen = {}
    x.register_hook(lambda g: g + 1)
    y = (x @ w).tanh()

    def on_y(g):
        seen["y"] = g.clone()
        return g * 3
    y.register_hook(on_y)
    h = y * 2
    loss = (h * h).sum()
    loss.backward()
    return {"x_grad": x.grad, "w_grad": w.grad, "y_seen": seen["y"]}


cases["tensor_hooks"] = tensor_hooks()


def relu_hook():
    # a hook on a ReLU's output sees the gradient before the ReLU's mask
    x, w = x_of(), w_of()
    y = (x @ w + filled((2, 2), lambda i: 0.4 * i - 0.2)).relu()
    seen = {}

    def on_y(g):
        seen["y"] = g.clone()
        return g * 0.5
    y.register_hook(on_y)
    v = filled((2, 4), lambda i: 1.0 - 0.25 * i)
    loss = ((y @ v) ** 2).sum() + (y @ v).sum()
    loss.backward()
    return {"x_grad": x.grad, "w_grad": w.grad, "y_seen": seen["y"]}


cases["relu_hook"] = relu_hook()


def linear_module():
    m = nn.Linear(3, 2)
    with torch.no_grad():
        m.weight.copy_(filled((2, 3), lambda i: 0.1 * i - 0.2))
        m.bias.copy_(torch.tensor([0.3, -0.4]))
    return m


def module_backward_hook():
    m = linear_module()
    seen = {}

    def hook(mod, grad_input, grad_output):
        seen["gi"] = grad_input[0].clone()
        seen["go"] = grad_output[0].clone()
        return (grad_input[0] * 0.5,)
    m.register_full_backward_hook(hook)
    x = x_of()
    y = m(x)
    loss = (y.tanh() * filled((2, 2), lambda i: i + 1.0)).sum()
    loss.backward()
    return {"x_grad": x.grad, "weight_grad": m.weight.grad, "bias_grad": m.bias.grad,
            "grad_input": seen["gi"], "grad_output": seen["go"]}


cases["module_backward_hook"] = module_backward_hook()


def module_forward_hooks():
    m = linear_module()
    m.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))
    m.register_forward_hook(lambda mod, args, out: out * 2)
    x = x_of()
    y = m(x)
    y.sum().backward()
    return {"y": y, "x_grad": x.grad, "weight_grad": m.weight.grad}


cases["module_forward_hooks"] = module_forward_hooks()


class Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(2))
        self.plist = nn.ParameterList([nn.Parameter(torch.zeros(3)), nn.Parameter(torch.ones(2, 2))])
        self.pdict = nn.ParameterDict({"alpha": nn.Parameter(torch.zeros(1)), "beta": nn.Parameter(torch.ones(4))})
        self.inner = nn.Sequential(nn.Linear(2, 2))


def state_dict_names():
    h = Holder()
    h.plist.append(nn.Parameter(torch.zeros(5)))
    return {"keys": list(h.state_dict().keys()), "named_parameters": [n for n, _ in h.named_parameters()]}


cases["state_dict_names"] = state_dict_names()


class Counter(nn.Module):
    """A module with extra state: a step count and a name."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.register_buffer("scale", torch.ones(2))
        self.steps = 7

    def get_extra_state(self):
        return {"steps": self.steps, "name": "counter"}

    def set_extra_state(self, state):
        self.steps = state["steps"]


def state_dict_hooks():
    """Keys with extra state; a load pre hook that renames an old key; a
    post hook that forgives a missing key; the state dict post hook."""
    outer = nn.Sequential(Counter(), nn.Linear(2, 1))
    keys = list(outer.state_dict().keys())
    sd = outer.state_dict()
    sd["0._extra_state"] = {"steps": 42, "name": "x"}
    old = {("1.old_bias" if k == "1.bias" else k): v for k, v in sd.items()}

    def rename(state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        if prefix + "old_bias" in state_dict:
            state_dict[prefix + "bias"] = state_dict.pop(prefix + "old_bias")

    outer[1]._register_load_state_dict_pre_hook(rename)
    outer.load_state_dict(old)
    fresh = nn.Sequential(Counter(), nn.Linear(2, 1))
    fresh.register_load_state_dict_post_hook(lambda m, inc: inc.missing_keys.remove("1.weight"))
    partial = {k: v for k, v in sd.items() if k != "1.weight"}
    result = fresh.load_state_dict(partial)
    return {"keys": keys, "steps_after_load": outer[0].steps, "missing_after_hook": list(result.missing_keys)}


cases["state_dict_hooks"] = state_dict_hooks()


def functional_cases():
    """torch.autograd.functional on x_of() (2, 3) and w_of() (3, 2), float64."""
    AF = torch.autograd.functional
    x = torch.tensor([0.3 * i - 0.7 for i in range(6)], dtype=torch.float64).reshape(2, 3)
    w = torch.tensor([math.sin(i + 1) for i in range(6)], dtype=torch.float64).reshape(3, 2)
    f = lambda a, b: (a @ b).tanh()
    J = AF.jacobian(f, (x, w))
    y, g = AF.vjp(lambda a: a.sin() * a, x, torch.cos(torch.arange(6, dtype=torch.float64)).reshape(2, 3))
    y2, jv = AF.jvp(lambda a, b: (a @ b).exp(), (x, w), (torch.ones(2, 3, dtype=torch.float64) * 0.5, w.cos()))
    return {"jacobian_x": J[0], "jacobian_w": J[1], "jacobian_single": AF.jacobian(lambda a: a.square().sum(1), x),
            "vjp_y": y, "vjp": g, "jvp_y": y2, "jvp": jv}


cases["functional"] = functional_cases()

print_cases("gen_autograd_ref.py", cases, lua)
