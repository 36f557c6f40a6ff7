#!/usr/bin/python3
"""Writes tests/ref/lr_scheduler.lua: the learning rates (and, for
OneCycleLR and CyclicLR, the momenta) that PyTorch's schedulers give, step by step, for
the schedulers tests/lua/test_lr_scheduler.lua checks (the others are in
tests/lua/test_optim.lua).
    /usr/bin/python3 scripts/gen_lr_scheduler_ref.py > tests/ref/lr_scheduler.lua
The formulas are those of the torch this runs with (Debian's 1.13).
"""
import warnings

import torch
from reflua import lua
from torch.optim import SGD, Adam
from torch.optim import lr_scheduler as S

warnings.filterwarnings("ignore")
torch.set_default_dtype(torch.float64)


def opt_of(groups, kind="sgd"):
    params = [{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in groups]
    if kind == "sgd":
        return SGD(params, lr=groups[0], momentum=0.9)
    return Adam(params, lr=groups[0], betas=(0.9, 0.99))


def lrs(make, n, groups=(0.1,), kind="sgd", epochs=None, metrics=None, momenta=False):
    """The lrs after construction and after each of n steps; step(epochs[i])
    when epochs are given, step(metrics[i]) for ReduceLROnPlateau. With
    momenta, each entry is {lrs, momenta} (SGD's momentum or Adam's beta1)."""
    opt = opt_of(groups, kind)
    sched = make(opt)

    def now():
        lr = [g["lr"] for g in opt.param_groups]
        if not momenta:
            return lr
        m = [g["momentum"] if kind == "sgd" else g["betas"][0] for g in opt.param_groups]
        return [lr, m]

    out = [now()]
    for i in range(n):
        opt.step()
        if metrics is not None:
            sched.step(metrics[i])
        elif epochs is not None:
            sched.step(epochs[i])
        else:
            sched.step()
        out.append(now())
    return out


def odd_even(e):
    return 0.9 if e % 2 else 1.1


PLATEAU = [1.0, 0.95, 0.94, 0.93, 0.92, 0.5, 0.49, 0.48, 0.6, 0.7, 0.8, 0.9, 0.3, 0.3, 0.3, 0.3]
cases = {
    "multistep": lambda: lrs(lambda o: S.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.5), 12, (0.1, 0.3)),
    "multistep_default": lambda: lrs(lambda o: S.MultiStepLR(o, [3]), 5),
    "multistep_epochs": lambda: lrs(lambda o: S.MultiStepLR(o, [2, 5, 5], gamma=0.5), 5, epochs=[6, 1, 2, 5, 0]),
    "exponential": lambda: lrs(lambda o: S.ExponentialLR(o, gamma=0.9), 8, (0.1, 1.0)),
    "exponential_epochs": lambda: lrs(lambda o: S.ExponentialLR(o, 0.5), 3, epochs=[4, 2, 0]),
    "multiplicative": lambda: lrs(lambda o: S.MultiplicativeLR(o, odd_even), 8, (0.1, 0.2)),
    "constant": lambda: lrs(lambda o: S.ConstantLR(o, factor=0.5, total_iters=3), 6),
    "constant_default": lambda: lrs(lambda o: S.ConstantLR(o), 7, (0.3,)),
    "constant_epochs": lambda: lrs(lambda o: S.ConstantLR(o, factor=0.25, total_iters=2), 3, epochs=[5, 1, 2]),
    "polynomial": lambda: lrs(lambda o: S.PolynomialLR(o, total_iters=4, power=2.0), 7, (0.1, 0.5)),
    "polynomial_default": lambda: lrs(lambda o: S.PolynomialLR(o), 7),
    "polynomial_epochs": lambda: lrs(lambda o: S.PolynomialLR(o, total_iters=4), 3, epochs=[2, 6, 1]),
    "restarts": lambda: lrs(lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3, eta_min=0.01), 10, (0.1, 0.05)),
    "restarts_mult": lambda: lrs(lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2), 15),
    "restarts_epochs": lambda: lrs(lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2, T_mult=2, eta_min=0.001), 8,
                                   epochs=[0.5, 1.25, 2.0, 3.5, 6.0, 6.75, 13.5, 1.0]),
    "cyclic": lambda: lrs(lambda o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=3), 14, momenta=True),
    "cyclic_triangular2_down": lambda: lrs(lambda o: S.CyclicLR(o, base_lr=[0.01, 0.02], max_lr=[0.1, 0.3],
                                                                 step_size_up=2, step_size_down=4, mode="triangular2"),
                                           16, groups=(0.1, 0.2), momenta=True),
    "cyclic_exp_range": lambda: lrs(lambda o: S.CyclicLR(o, base_lr=0.001, max_lr=0.01, step_size_up=2,
                                                          mode="exp_range", gamma=0.9, base_momentum=0.85,
                                                          max_momentum=0.95), 9, momenta=True),
    "cyclic_no_momentum": lambda: lrs(lambda o: S.CyclicLR(o, base_lr=0.05, max_lr=0.2, step_size_up=2,
                                                            cycle_momentum=False), 6),
    "onecycle": lambda: lrs(lambda o: S.OneCycleLR(o, max_lr=1.0, total_steps=10), 10, momenta=True),
    "onecycle_groups": lambda: lrs(lambda o: S.OneCycleLR(o, max_lr=[1.0, 0.5], epochs=3, steps_per_epoch=4,
                                                          pct_start=0.25, anneal_strategy="linear",
                                                          div_factor=10.0, final_div_factor=100.0),
                                   12, (0.1, 0.2), momenta=True),
    "onecycle_three_phase": lambda: lrs(lambda o: S.OneCycleLR(o, max_lr=0.5, total_steps=12, three_phase=True,
                                                               base_momentum=0.8, max_momentum=0.9),
                                        12, momenta=True),
    "onecycle_adam": lambda: lrs(lambda o: S.OneCycleLR(o, max_lr=0.01, total_steps=6), 6, kind="adam", momenta=True),
    "onecycle_no_momentum": lambda: lrs(lambda o: S.OneCycleLR(o, max_lr=0.01, total_steps=5, cycle_momentum=False),
                                        5, momenta=True),
    "plateau": lambda: lrs(lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=2, threshold=0.1, cooldown=1,
                                                         min_lr=0.01), len(PLATEAU), (0.1, 0.04), metrics=PLATEAU),
    "plateau_default": lambda: lrs(lambda o: S.ReduceLROnPlateau(o), len(PLATEAU) * 2, metrics=PLATEAU * 2),
    "plateau_max_abs": lambda: lrs(lambda o: S.ReduceLROnPlateau(o, mode="max", factor=0.1, patience=1,
                                                                 threshold=0.05, threshold_mode="abs",
                                                                 min_lr=[0.001, 0.05]),
                                   len(PLATEAU), (0.1, 0.2), metrics=PLATEAU),
    "chained": lambda: lrs(lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.1, total_iters=2),
                                                         S.ExponentialLR(o, gamma=0.9)]), 6),
}



print("-- generated by scripts/gen_lr_scheduler_ref.py with torch " + torch.__version__ + "; do not edit")
print("return {")
print("  plateau_metrics = %s," % lua(PLATEAU))
for k in sorted(cases):
    print("  %s = %s," % (k, lua(cases[k]())))
print("}")
