#!/usr/bin/python3
"""Writes tests/ref/distributions.lua: PyTorch's log_prob, entropy, mean,
variance, cdf and kl_divergence of torch.distributions' Normal, Categorical,
Bernoulli, Uniform, Independent, Exponential, Laplace, Cauchy, LogNormal,
HalfNormal, HalfCauchy, Gamma, Chi2, Beta, Dirichlet, Kumaraswamy,
FisherSnedecor, Poisson, Geometric, Binomial, NegativeBinomial, Multinomial,
OneHotCategorical, RelaxedBernoulli, RelaxedOneHotCategorical,
MultivariateNormal and LowRankMultivariateNormal, and the parameters' gradients of
sum(log_prob * cos(k)) + sum(entropy), for tests/lua/test_distributions.lua,
in float64. Parameters and values are the lists below.
    cd scripts && /usr/bin/python3 gen_distributions_ref.py > ../tests/ref/distributions.lua
"""
import math

import torch
import torch.distributions as D
from reflua import lua, lua_value, print_cases

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
# The other distributions: (class, positional parameters as (name, value),
# keyword parameters, the value for log_prob, the second distribution's
# parameters for kl_divergence or None, whether it has an entropy).
MORE = {
    "exponential": (D.Exponential, [("rate", [0.5, 2.0, 7.0])], {}, [0.3, 1.5, 0.01], [[1.5, 0.25, 2.0]], True),
    "laplace": (D.Laplace, [("loc", [0.5, -1.0, 2.0]), ("scale", [1.5, 0.25, 3.0])], {}, [0.0, -0.75, 4.5],
                [[0.0, -0.5, 2.5], [1.0, 0.5, 2.0]], True),
    "cauchy": (D.Cauchy, [("loc", [0.5, -1.0]), ("scale", [1.5, 0.25])], {}, [0.0, 3.0], None, True),
    "log_normal": (D.LogNormal, [("loc", [0.5, -1.0]), ("scale", [1.5, 0.25])], {}, [0.7, 0.4],
                   [[0.0, -0.5], [1.0, 0.5]], True),
    "half_normal": (D.HalfNormal, [("scale", [1.5, 0.25])], {}, [0.7, 0.4], [[1.0, 0.5]], True),
    "gamma": (D.Gamma, [("concentration", [0.5, 2.0, 9.0]), ("rate", [1.5, 0.25, 3.0])], {}, [0.3, 5.0, 2.5],
              [[1.0, 2.5, 4.0], [1.0, 0.5, 2.0]], True),
    "chi2": (D.Chi2, [("df", [1.0, 3.5, 10.0])], {}, [0.3, 5.0, 12.0], None, True),
    "beta": (D.Beta, [("concentration1", [0.5, 2.0, 9.0]), ("concentration0", [1.5, 0.25, 3.0])], {},
             [0.3, 0.9, 0.5], [[1.0, 2.5, 4.0], [1.0, 0.5, 2.0]], True),
    "dirichlet": (D.Dirichlet, [("concentration", [[0.5, 2.0, 3.0], [1.0, 1.0, 7.5]])], {},
                  [[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]], [[[1.0, 1.5, 2.0], [0.5, 3.0, 3.0]]], True),
    "poisson": (D.Poisson, [("rate", [0.5, 4.0, 30.0])], {}, [0.0, 3.0, 27.0], [[1.0, 2.0, 33.0]], False),
    "geometric": (D.Geometric, [], {"probs": [0.2, 0.5, 0.9]}, [0.0, 3.0, 1.0], None, True),
    "binomial": (D.Binomial, [("total_count", [10.0, 4.0, 25.0])], {"probs": [0.2, 0.5, 0.9]}, [3.0, 0.0, 25.0], None,
                 False),
    "binomial_logits": (D.Binomial, [("total_count", [10.0, 4.0])], {"logits": [-1.5, 2.0]}, [3.0, 4.0], None, False),
    "gumbel": (D.Gumbel, [("loc", [0.5, -1.0, 2.0]), ("scale", [1.5, 0.25, 3.0])], {}, [0.0, -0.75, 4.5], None, True),
    "weibull": (D.Weibull, [("scale", [0.5, 2.0, 1.0]), ("concentration", [1.5, 0.25, 3.0])], {}, [0.3, 5.0, 1.2],
                None, True),
    "pareto": (D.Pareto, [("scale", [0.5, 2.0]), ("alpha", [1.5, 3.5])], {}, [0.7, 4.0], None, True),
    "student_t": (D.StudentT, [("df", [0.8, 3.0, 12.0]), ("loc", [0.5, -1.0, 2.0]), ("scale", [1.5, 0.25, 3.0])], {},
                  [0.0, -0.75, 4.5], None, True),
    "one_hot_categorical": (D.OneHotCategorical, [], {"probs": [[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]]},
                            [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], None, True),
    "multivariate_normal": (D.MultivariateNormal, [("loc", [[1.0, -1.0, 0.5], [0.0, 2.0, 0.0]])],
                            {"covariance_matrix": [[2.0, 0.5, 0.1], [0.5, 1.0, -0.3], [0.1, -0.3, 1.5]]},
                            [[0.5, 0.2, 0.0], [1.0, 1.0, -1.0]], None, True),
    "multivariate_normal_scale_tril": (D.MultivariateNormal, [("loc", [1.0, -1.0])],
                                       {"scale_tril": [[1.5, 0.0], [0.5, 0.75]]}, [0.5, 0.2], None, True),
    "multivariate_normal_precision": (D.MultivariateNormal, [("loc", [1.0, -1.0])],
                                      {"precision_matrix": [[2.0, 0.5], [0.5, 1.0]]}, [0.5, 0.2], None, True),
    "half_cauchy": (D.HalfCauchy, [("scale", [1.5, 0.25])], {}, [0.7, 0.4], None, True),
    "negative_binomial": (D.NegativeBinomial, [("total_count", [3.0, 5.0, 0.5])], {"probs": [0.3, 0.6, 0.1]},
                          [2.0, 7.0, 0.0], None, False),
    "negative_binomial_logits": (D.NegativeBinomial, [("total_count", [3.0, 5.0])], {"logits": [-1.0, 0.5]},
                                 [4.0, 1.0], None, False),
    "kumaraswamy": (D.Kumaraswamy, [("concentration1", [0.5, 2.0, 5.0]), ("concentration0", [1.5, 3.0, 0.7])], {},
                    [0.3, 0.9, 0.5], None, True),
    "fisher_snedecor": (D.FisherSnedecor, [("df1", [1.5, 3.0, 10.0]), ("df2", [5.0, 7.0, 20.0])], {},
                        [0.3, 1.2, 2.5], None, False),
    "continuous_bernoulli": (D.ContinuousBernoulli, [], {"probs": [0.2, 0.5, 0.7, 0.4995, 0.999]},
                             [0.3, 0.6, 0.9, 0.1, 0.5], None, True),
    "continuous_bernoulli_logits": (D.ContinuousBernoulli, [], {"logits": [-1.5, 0.0, 3.0]}, [0.3, 0.6, 1.0], None,
                                    True),
    "low_rank_multivariate_normal": (D.LowRankMultivariateNormal,
                                     [("loc", [[1.0, -1.0, 0.5], [0.0, 2.0, 0.0]]),
                                      ("cov_factor", [[1.0, 0.5], [0.2, -0.3], [0.4, 0.8]]),
                                      ("cov_diag", [0.5, 1.0, 2.0])], {},
                                     [[0.5, 0.2, 0.0], [1.0, 1.0, -1.0]], None, True),
}
for name, (cls, pos, kw, value, kl_params, has_entropy) in MORE.items():
    ps = {k: T(v).requires_grad_() for k, v in pos}
    ks = {k: T(v).requires_grad_() for k, v in kw.items()}
    if cls in (D.Binomial, D.NegativeBinomial):
        ps["total_count"].requires_grad_(False)
    d = cls(*ps.values(), **ks)
    lp = d.log_prob(T(value))
    w = torch.cos(torch.arange(lp.numel(), dtype=torch.float64)).reshape(lp.shape)
    loss = (lp * w).sum()
    c = {"log_prob": lp.detach().reshape(-1).tolist()}
    if has_entropy:
        ent = d.entropy()
        loss = loss + ent.sum()
        c["entropy"] = ent.detach().reshape(-1).tolist()
    loss.backward()
    c["mean"] = d.mean.detach().reshape(-1).tolist()
    c["variance"] = d.variance.detach().reshape(-1).tolist()
    for k, p in list(ps.items()) + list(ks.items()):
        if p.grad is not None:
            c["d_" + k] = p.grad.reshape(-1).tolist()
    if kl_params is not None:
        q = cls(*[T(v) for v in kl_params])
        c["kl"] = D.kl_divergence(cls(*[p.detach() for p in ps.values()]), q).reshape(-1).tolist()
    if hasattr(d, "cdf") and cls in (D.Exponential, D.Laplace, D.Cauchy, D.HalfNormal, D.HalfCauchy,
                                           D.ContinuousBernoulli):
        c["cdf"] = d.cdf(T(value)).detach().reshape(-1).tolist()
    if cls in (D.Gamma, D.Chi2):   # PyTorch 2's Gamma.cdf, which 1.13 lacks
        c["cdf"] = torch.special.gammainc(d.concentration, d.rate * T(value)).detach().reshape(-1).tolist()
    cases[name] = c

# TransformedDistribution: log_prob at fixed values, and the gradients of its
# weighted sum with respect to the base's parameters
TR = D.transforms
TRANSFORMED = {
    "transformed_tanh": (lambda p: D.Normal(p[0], p[1]), [[0.5, -1.0, 0.2], [1.0, 0.3, 2.0]], [TR.TanhTransform()],
                         [-0.9, 0.2, 0.95]),
    "transformed_affine_exp": (lambda p: D.Normal(p[0], p[1]), [[0.5, -1.0, 0.2], [1.0, 0.3, 2.0]],
                               [TR.AffineTransform(1.0, 2.0), TR.ExpTransform()], [2.0, 3.0, 0.5]),
    "transformed_sigmoid": (lambda p: D.Normal(p[0], p[1]), [[0.5, -1.0], [1.0, 0.3]], [TR.SigmoidTransform()],
                            [0.3, 0.8]),
    "transformed_power": (lambda p: D.Exponential(p[0]), [[0.5, 2.0]], [TR.PowerTransform(0.5)], [0.7, 1.3]),
    "transformed_independent_tanh": (lambda p: D.Independent(D.Normal(p[0], p[1]), 1), [[[0.5, -1.0], [0.1, 0.2]],
                                     [[1.0, 0.3], [0.5, 0.7]]], [TR.TanhTransform()], [[-0.5, 0.25], [0.9, -0.1]]),
    "transformed_softplus": (lambda p: D.Normal(p[0], p[1]), [[0.5, -1.0, 0.2], [1.0, 0.3, 2.0]],
                             [TR.SoftplusTransform()], [0.5, 2.0, 0.1]),
    "transformed_stick_breaking": (lambda p: D.Independent(D.Normal(p[0], p[1]), 1), [[0.3, -0.5], [1.0, 0.5]],
                                   [TR.StickBreakingTransform()], [0.2, 0.3, 0.5]),
    "transformed_independent_exp": (lambda p: D.Independent(D.Normal(p[0], p[1]), 1), [[[0.5, -1.0], [0.1, 0.2]],
                                    [[1.0, 0.3], [0.5, 0.7]]], [TR.IndependentTransform(TR.ExpTransform(), 1)],
                                    [[0.5, 2.0], [1.5, 0.3]]),
    "transformed_reshape": (lambda p: D.Independent(D.Normal(p[0], p[1]), 1), [[0.5, -1.0, 0.1, 0.2],
                            [1.0, 0.3, 0.5, 0.7]], [TR.ReshapeTransform((4,), (2, 2))], [[0.5, 2.0], [1.5, 0.3]]),
    "transformed_cdf": (lambda p: D.Normal(p[0], p[1]), [[0.5, -1.0], [1.0, 0.3]],
                        [TR.CumulativeDistributionTransform(D.Normal(T(0.0), T(1.0)))], [0.3, 0.8]),
}
for name, (make, params, transforms, value) in TRANSFORMED.items():
    ps = [T(v).requires_grad_() for v in params]
    d = D.TransformedDistribution(make(ps), transforms)
    lp = d.log_prob(T(value))
    (lp * torch.cos(torch.arange(lp.numel(), dtype=torch.float64)).reshape(lp.shape)).sum().backward()
    c = {"log_prob": lp.detach().reshape(-1).tolist()}
    for i, p in enumerate(ps):
        c["d%d" % i] = p.grad.reshape(-1).tolist()
    cases[name] = c

loc, scale = T([0.3, -0.5, 1.0]).requires_grad_(), T([1.0, 0.5, 2.0]).requires_grad_()
lp = D.LogisticNormal(loc, scale).log_prob(T([[0.2, 0.3, 0.1, 0.4], [0.05, 0.05, 0.6, 0.3]]))
(lp * torch.cos(torch.arange(lp.numel(), dtype=torch.float64))).sum().backward()
cases["logistic_normal"] = {"log_prob": lp.tolist(), "d_loc": loc.grad.tolist(), "d_scale": scale.grad.tolist()}
cases["normal_icdf"] = {"icdf": D.Normal(T([0.5, -1.0, 2.0]), T([1.5, 0.25, 3.0])).icdf(T([0.1, 0.5, 0.975])).tolist()}

# MixtureSameFamily: a batch of 2 mixtures of 3 normals (log_prob, mean,
# variance, cdf, gradients), and a mixture of 2 diagonal 2-D normals
logits = T([[0.2, -0.5, 1.0], [0.0, 0.3, -1.2]]).requires_grad_()
mloc = T([[-1.0, 0.5, 2.0], [0.0, 1.0, -2.0]]).requires_grad_()
mscale = T([[0.5, 1.0, 1.5], [2.0, 0.3, 0.7]]).requires_grad_()
mix = D.MixtureSameFamily(D.Categorical(logits=logits), D.Normal(mloc, mscale))
x = T([[0.1, 1.2], [-1.5, 2.5], [0.7, -0.3]])
lp = mix.log_prob(x)
(lp * torch.cos(torch.arange(lp.numel(), dtype=torch.float64)).reshape(lp.shape)).sum().backward()
cases["mixture_normal"] = {"log_prob": lp.detach().reshape(-1).tolist(), "mean": mix.mean.detach().tolist(),
                           "variance": mix.variance.detach().tolist(), "cdf": mix.cdf(x).detach().reshape(-1).tolist(),
                           "d_logits": logits.grad.reshape(-1).tolist(), "d_loc": mloc.grad.reshape(-1).tolist(),
                           "d_scale": mscale.grad.reshape(-1).tolist()}
mix2 = D.MixtureSameFamily(D.Categorical(probs=T([0.4, 0.6])),
                           D.Independent(D.Normal(T([[0.0, 1.0], [2.0, -1.0]]), T([[1.0, 0.5], [0.7, 2.0]])), 1))
cases["mixture_independent"] = {"log_prob": mix2.log_prob(T([[0.5, 0.5], [2.0, -2.0]])).tolist(),
                                "mean": mix2.mean.tolist(), "variance": mix2.variance.tolist()}

# Multinomial and the relaxed distributions: log_prob and its gradients
def weighted(lp):
    return (lp * torch.cos(torch.arange(lp.numel(), dtype=torch.float64)).reshape(lp.shape)).sum()


probs = T([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]]).requires_grad_()
mn = D.Multinomial(6, probs=probs)
lp = mn.log_prob(T([[1.0, 2.0, 3.0], [6.0, 0.0, 0.0]]))
weighted(lp).backward()
cases["multinomial"] = {"log_prob": lp.tolist(), "mean": mn.mean.reshape(-1).tolist(),
                        "variance": mn.variance.reshape(-1).tolist(), "d_probs": probs.grad.reshape(-1).tolist()}
logits = T([-1.0, 0.5, 2.0]).requires_grad_()
rb = D.RelaxedBernoulli(T(0.7), logits=logits)
lp = rb.log_prob(T([0.2, 0.5, 0.95]))
weighted(lp).backward()
cases["relaxed_bernoulli"] = {"log_prob": lp.tolist(), "d_logits": logits.grad.tolist()}
logits = T([[0.2, -0.5, 1.0], [0.0, 0.3, -1.2]]).requires_grad_()
temperature = T(0.6).requires_grad_()
ro = D.RelaxedOneHotCategorical(temperature, logits=logits)
lp = ro.log_prob(T([[0.2, 0.3, 0.5], [0.7, 0.2, 0.1]]))
weighted(lp).backward()
cases["relaxed_one_hot_categorical"] = {"log_prob": lp.tolist(), "d_logits": logits.grad.reshape(-1).tolist(),
                                        "d_temperature": [temperature.grad.item()]}

# VonMises: PyTorch's log I0 is a polynomial fit good to about 1e-7, so its
# exact values come from mpmath (40 digits); PyTorch's beside them
import mpmath
mpmath.mp.dps = 40
vm_loc, vm_k, vm_x = [0.3, -1.0, 2.0, 0.0, 1.5], [0.5, 2.0, 10.0, 50.0, 700.0], [0.1, 0.5, 2.2, -0.1, 1.45]
vm = D.VonMises(T(vm_loc), T(vm_k))
cases["von_mises"] = {
    "log_prob_exact": [float(k * mpmath.cos(x - l) - mpmath.log(2 * mpmath.pi) - mpmath.log(mpmath.besseli(0, k)))
                       for l, k, x in zip(vm_loc, vm_k, vm_x)],
    "variance_exact": [float(1 - mpmath.besseli(1, k) / mpmath.besseli(0, k)) for k in vm_k],
    "log_prob_torch": vm.log_prob(T(vm_x)).tolist()}
logits = T([0.2, -0.5, 1.0]).requires_grad_()
st = D.OneHotCategoricalStraightThrough(logits=logits).rsample((4,))
(st * torch.cos(torch.arange(12, dtype=torch.float64)).reshape(4, 3)).sum().backward()
cases["one_hot_straight_through"] = {"d_logits": logits.grad.tolist()}

# Wishart: log_prob, entropy, moments and their gradients, by each matrix argument
df = T([5.0, 3.5]).requires_grad_()
cov = T([[2.0, 0.5, 0.1], [0.5, 1.0, -0.3], [0.1, -0.3, 1.5]]).requires_grad_()
wv = T([[[3.0, 1.0, 0.2], [1.0, 2.0, 0.1], [0.2, 0.1, 1.0]], [[1.0, 0.2, 0.0], [0.2, 2.0, 0.5], [0.0, 0.5, 3.0]]])
wd = D.Wishart(df, covariance_matrix=cov)
lp, ent = wd.log_prob(wv), wd.entropy()
(weighted(lp) + ent.sum()).backward()
cases["wishart"] = {"log_prob": lp.tolist(), "entropy": ent.tolist(), "mean": wd.mean.reshape(-1).tolist(),
                    "variance": wd.variance.reshape(-1).tolist(), "d_df": df.grad.tolist(),
                    "d_cov": cov.grad.reshape(-1).tolist()}
st = T([[1.0, 0.0], [0.3, 2.0]])
cases["wishart_scale_tril"] = {"log_prob": [D.Wishart(T(4.0), scale_tril=st).log_prob(T([[2.0, 0.5], [0.5, 3.0]])).item()]}
cases["wishart_precision"] = {"log_prob": [D.Wishart(T(4.0), precision_matrix=T([[2.0, 0.5], [0.5, 1.0]])).log_prob(
    T([[2.0, 0.5], [0.5, 3.0]])).item()]}

# LKJCholesky: log_prob and its gradient in the concentration
lkj_c = T([0.5, 3.0]).requires_grad_()
lkj_v = T([[1, 0, 0, 0], [0.6, 0.8, 0, 0], [0, 0.6, 0.8, 0], [0.36, 0.48, 0, 0.8]])
lp = D.LKJCholesky(4, lkj_c).log_prob(lkj_v)
weighted(lp).backward()
cases["lkj_cholesky"] = {"log_prob": lp.tolist(), "d_concentration": lkj_c.grad.tolist(),
                         "log_prob_3": [D.LKJCholesky(3, T(2.0)).log_prob(T([[1, 0, 0], [0.6, 0.8, 0], [0.0, 0.6, 0.8]])).item()]}

# constraints: check() on fixed values; biject_to / transform_to of each
# kind: the values, their inverses and the log-Jacobians; supports' names
from torch.distributions import constraints as K, biject_to, transform_to
vals = T([-1.5, 0.0, 0.5, 1.0, 2.0, 3.0])
checks = {"real": K.real, "positive": K.positive, "nonnegative": K.nonnegative, "unit_interval": K.unit_interval,
          "interval": K.interval(-1.0, 2.0), "half_open_interval": K.half_open_interval(0.0, 1.0),
          "greater_than": K.greater_than(0.5), "greater_than_eq": K.greater_than_eq(0.5), "less_than": K.less_than(1.0),
          "nonnegative_integer": K.nonnegative_integer, "positive_integer": K.positive_integer,
          "integer_interval": K.integer_interval(0, 2), "boolean": K.boolean}
cases["constraint_checks"] = {k: [bool(b) for b in c.check(vals).tolist()] for k, c in checks.items()}
cases["constraint_checks"]["simplex"] = [bool(b) for b in K.simplex.check(T([[0.5, 0.5], [0.2, 0.9], [1.0, 0.0]])).tolist()]
cases["constraint_checks"]["lower_cholesky"] = [bool(b) for b in K.lower_cholesky.check(
    T([[[1.0, 0.0], [0.5, 2.0]], [[1.0, 0.3], [0.5, 2.0]], [[-1.0, 0.0], [0.5, 2.0]]])).tolist()]
x = T([-2.0, -0.3, 0.0, 0.7, 3.0])
bij = {}
for name, c, f in (("positive", K.positive, biject_to), ("greater_than", K.greater_than(1.5), biject_to),
                   ("less_than", K.less_than(-1.0), biject_to), ("interval", K.interval(-1.0, 2.0), biject_to),
                   ("unit_interval", K.unit_interval, biject_to), ("real", K.real, biject_to)):
    t = f(c)
    y = t(x)
    bij[name] = {"y": y.tolist(), "ladj": t.log_abs_det_jacobian(x, y).tolist(), "inv": t.inv(y).tolist()}
xs = T([[0.3, -0.5, 1.2], [0.0, 2.0, -1.0]])
t = biject_to(K.simplex)
bij["simplex_biject"] = {"y": t(xs).reshape(-1).tolist(), "ladj": t.log_abs_det_jacobian(xs, t(xs)).tolist()}
bij["simplex_transform"] = {"y": transform_to(K.simplex)(xs).reshape(-1).tolist()}
xc = T([[0.5, 1.0], [-1.0, 0.3], [2.0, 0.1]])
t = TR.CatTransform([TR.ExpTransform(), TR.AffineTransform(1.0, 2.0)], dim=0, lengths=[2, 1])
bij["cat"] = {"y": t(xc).reshape(-1).tolist(), "ladj": t.log_abs_det_jacobian(xc, t(xc)).reshape(-1).tolist(),
              "inv": t.inv(t(xc)).reshape(-1).tolist()}
t = TR.CatTransform([TR.ExpTransform(), TR.ExpTransform()], dim=-1, lengths=[1, 1])
bij["cat_last"] = {"ladj": t.log_abs_det_jacobian(xc, t(xc)).reshape(-1).tolist()}
t = TR.StackTransform([TR.ExpTransform(), TR.SigmoidTransform()], dim=1)
bij["stack"] = {"y": t(xc[:2]).reshape(-1).tolist(), "ladj": t.log_abs_det_jacobian(xc[:2], t(xc[:2])).reshape(-1).tolist()}
t = TR.CorrCholeskyTransform()
xcc = T([[[0.3, -0.5, 1.2], [0.0, 2.0, -1.0]], [[0.1, 0.2, -0.3], [1.5, -0.7, 0.4]]])
bij["corr_cholesky"] = {"y": t(xcc).reshape(-1).tolist(), "ladj": t.log_abs_det_jacobian(xcc, t(xcc)).reshape(-1).tolist()}
x6 = T([0.3, -0.5, 1.2, 0.0, 2.0, -1.0])
bij["corr_cholesky_4"] = {"y": t(x6).reshape(-1).tolist(), "ladj": [t.log_abs_det_jacobian(x6, t(x6)).item()]}
cases["bijections"] = bij
cases["supports"] = {"names": [str(d.support) for d in (
    D.Normal(0.0, 1.0), D.Exponential(1.0), D.Gamma(1.0, 1.0), D.Pareto(1.0, 2.0), D.Uniform(0.0, 2.0),
    D.Binomial(3, T(0.5)), D.Categorical(torch.ones(3)), D.Beta(1.0, 1.0), D.Dirichlet(torch.ones(3)),
    D.Poisson(1.0), D.Bernoulli(T(0.5)), D.LogNormal(0.0, 1.0), D.Independent(D.Normal(torch.zeros(2), torch.ones(2)), 1),
    D.MultivariateNormal(torch.zeros(2), torch.eye(2)), D.Geometric(T(0.5)), D.HalfNormal(1.0), D.Weibull(1.0, 1.0))]}

mvn_p = D.MultivariateNormal(T([1.0, -1.0]), T([[2.0, 0.5], [0.5, 1.0]]))
mvn_q = D.MultivariateNormal(T([0.0, 0.5]), T([[1.0, -0.2], [-0.2, 0.5]]))
cases["multivariate_normal_kl"] = {"kl": [D.kl_divergence(mvn_p, mvn_q).item()]}
print_cases("gen_distributions_ref.py", cases, lua_value)
