#!/usr/bin/python3
"""Writes tests/ref/linalg.lua: PyTorch's torch.linalg results and the
gradients of sum(result * cos(k)) with respect to the inputs, for
tests/lua/test_linalg.lua, in float64. A (2, 4, 4) holds sin(1 + 0.7 k) *
2 + 3 on the diagonal (well conditioned), B (2, 4, 3) cos(2 + 1.1 k), the
tall M (5, 3) sin(0.5 + 0.9 k), the vector v (6) cos(0.3 + 1.7 k); each
case names its inputs and how the result is read (a second result of
slogdet and qr as `y2`).
    cd scripts && /usr/bin/python3 gen_linalg_ref.py > ../tests/ref/linalg.lua
"""
import math

import torch
from reflua import filled, lua, print_cases

torch.set_default_dtype(torch.float64)


def inputs():
    A = filled((2, 4, 4), lambda k: math.sin(1 + 0.7 * k) * 2) + 3 * torch.eye(4)
    B = filled((2, 4, 3), lambda k: math.cos(2 + 1.1 * k))
    M = filled((5, 3), lambda k: math.sin(0.5 + 1.3 * k * k))
    v = filled((6,), lambda k: math.cos(0.3 + 1.7 * k))
    return {"A": A, "B": B, "M": M, "v": v}


L = torch.linalg


def geqrf_q(i):
    """The Q of geqrf of A[i], through householder_product."""
    return L.householder_product(*torch.geqrf(inputs()["A"][i]))


ORMQR_CHECKS = {"ormqr": lambda B: torch.ormqr(*torch.geqrf(inputs()["A"][0]), B[0]),
                "ormqr_right_transpose": lambda B: torch.ormqr(*torch.geqrf(inputs()["A"][0]), B[0].t(), left=False,
                                                               transpose=True),
                "ormqr_transpose": lambda B: torch.ormqr(*torch.geqrf(inputs()["A"][1]), B[1], transpose=True),
                "ormqr_right": lambda B: torch.ormqr(*torch.geqrf(inputs()["A"][1]), B[1].t(), left=False)}

CASES = {
    "solve": (["A", "B"], lambda A, B: L.solve(A, B)),
    "solve_vector": (["A"], lambda A: L.solve(A, torch.tensor([1.0, -2.0, 0.5, 3.0]))),
    "inv": (["A"], lambda A: L.inv(A)),
    "det": (["A"], lambda A: L.det(A)),
    "slogdet": (["A"], lambda A: tuple(L.slogdet(A))),
    "cholesky": (["A"], lambda A: L.cholesky(A @ A.transpose(-2, -1) + torch.eye(4))),
    "qr": (["M"], lambda M: tuple(L.qr(M))),
    "qr_wide_complete": (["A"], lambda A: tuple(L.qr(A[0, :3, :], mode="complete"))),
    "qr_triangular": (["A"], lambda A: tuple(L.qr(A.triu()))),
    "geqrf": (["M"], lambda M: tuple(t.detach() for t in torch.geqrf(M))),
    "geqrf_triangular": (["A"], lambda A: tuple(t.detach() for t in torch.geqrf(A.triu()))),
    # (PyTorch has no derivative for ormqr: the same products through the
    # Q of householder_product, checked against ormqr's values below)
    "ormqr": (["B"], lambda B: geqrf_q(0) @ B[0]),
    "ormqr_right_transpose": (["B"], lambda B: B[0].t() @ geqrf_q(0).t()),
    "ormqr_transpose": (["B"], lambda B: geqrf_q(1).t() @ B[1]),
    "ormqr_right": (["B"], lambda B: B[1].t() @ geqrf_q(1)),
    "vector_norm": (["v"], lambda v: L.vector_norm(v)),
    "vector_norm_3": (["v"], lambda v: L.vector_norm(v, 3)),
    "vector_norm_inf": (["B"], lambda B: L.vector_norm(B, float("inf"), dim=-1)),
    "matrix_norm_fro": (["B"], lambda B: L.matrix_norm(B)),
    "matrix_norm_1": (["A"], lambda A: L.matrix_norm(A, 1)),
    "matrix_norm_inf_keepdim": (["A"], lambda A: L.matrix_norm(A, float("inf"), keepdim=True)),
    "norm_matrix": (["M"], lambda M: L.norm(M)),
    "multi_dot": (["M", "B"], lambda M, B: L.multi_dot([M.t(), M, B[0, :3, :]])),
    # eigenvectors and singular vectors are read squared: their signs are free
    "eigh": (["A"], lambda A: (lambda w, V: (w, V * V))(*L.eigh(A + A.transpose(-2, -1)))),
    "eigh_upper": (["A"], lambda A: (lambda w, V: (w, V * V))(*L.eigh(A, UPLO="U"))),
    "eigvalsh": (["A"], lambda A: L.eigvalsh(A @ A.transpose(-2, -1))),
    "svd_u": (["M"], lambda M: (lambda U, S, Vh: (S, U * U))(*L.svd(M, full_matrices=False))),
    "svd_vh": (["M"], lambda M: (lambda U, S, Vh: (S, Vh * Vh))(*L.svd(M, full_matrices=False))),
    "svd_wide": (["A"], lambda A: (lambda U, S, Vh: (S, Vh * Vh))(*L.svd(A[:, :3, :], full_matrices=False))),
    "svd_wide_u": (["A"], lambda A: (lambda U, S, Vh: (S, U * U))(*L.svd(A[:, :3, :], full_matrices=False))),
    "svd_full": (["M"], lambda M: (lambda U, S, Vh: (S, U[:, :3] * U[:, :3]))(*L.svd(M))),
    "svdvals": (["A"], lambda A: L.svdvals(A)),
    "pinv": (["M"], lambda M: L.pinv(M)),
    "pinv_wide": (["A"], lambda A: L.pinv(A[:, :3, :])),
    "cond": (["A"], lambda A: L.cond(A)),
    "matrix_norm_nuc": (["A"], lambda A: L.matrix_norm(A, "nuc")),
    "matrix_norm_2": (["A"], lambda A: L.matrix_norm(A, 2)),
    "matrix_norm_neg2_keepdim": (["A"], lambda A: L.matrix_norm(A, -2, keepdim=True)),
    "solve_triangular": (["A", "B"], lambda A, B: L.solve_triangular(A.triu(), B, upper=True)),
    "solve_triangular_lower_right_unit": (["A", "B"], lambda A, B: L.solve_triangular(
        A.tril(), B.transpose(-2, -1), upper=False, left=False, unitriangular=True)),
    "cholesky_solve": (["A", "B"], lambda A, B: torch.cholesky_solve(B, L.cholesky(A @ A.transpose(-2, -1) + torch.eye(4)))),
    "lstsq": (["M", "v"], lambda M, v: L.lstsq(M, v[:5].unsqueeze(-1)).solution),
    "matrix_power_3": (["A"], lambda A: L.matrix_power(A, 3)),
    "matrix_power_neg2": (["A"], lambda A: L.matrix_power(A, -2)),
    "matrix_exp": (["A"], lambda A: L.matrix_exp(A / 4)),
    "lu_factor": (["A"], lambda A: tuple(L.lu_factor(A))),
    "lu_factor_tall": (["M"], lambda M: tuple(L.lu_factor(M))),
    "lu_factor_wide": (["B"], lambda B: tuple(L.lu_factor(B.transpose(-2, -1)))),
    "lu_p": (["A"], lambda A: L.lu(A)[0]),
    "lu_l_u": (["A"], lambda A: tuple(L.lu(A)[1:])),
    "lu_tall_l_u": (["M"], lambda M: tuple(L.lu(M)[1:])),
    "lu_unpack_p": (["M"], lambda M: torch.lu_unpack(*L.lu_factor(M))[0]),
    "lu_solve": (["A", "B"], lambda A, B: L.lu_solve(*L.lu_factor(A), B)),
    "lu_solve_adjoint": (["A", "B"], lambda A, B: L.lu_solve(*L.lu_factor(A), B, adjoint=True)),
    "lu_solve_right": (["A", "B"], lambda A, B: L.lu_solve(*L.lu_factor(A), B.transpose(-2, -1), left=False)),
    "torch_lu_solve": (["A", "B"], lambda A, B: torch.lu_solve(B, *torch.lu(A))),
    "solve_ex": (["A", "B"], lambda A, B: tuple(L.solve_ex(A, B))),
    "inv_ex": (["A"], lambda A: tuple(L.inv_ex(A))),
    "cholesky_ex_upper": (["A"], lambda A: tuple(L.cholesky_ex(A @ A.transpose(-2, -1) + torch.eye(4), upper=True))),
    "cholesky_inverse": (["A"], lambda A: torch.cholesky_inverse(L.cholesky(A[0] @ A[0].t() + torch.eye(4)))),
    "tensorinv": (["A"], lambda A: L.tensorinv(A[0].reshape(2, 2, 4), ind=2)),
    "tensorsolve": (["A", "B"], lambda A, B: L.tensorsolve(A[0].reshape(4, 2, 2), B[0, :, 0])),
    "tensorsolve_dims": (["A", "B"], lambda A, B: L.tensorsolve(A[0].reshape(2, 4, 2), B[0, :, 0], dims=(0,))),
    "vander": (["v"], lambda v: L.vander(v[:4].reshape(2, 2), N=3)),
    "householder_product": (["M"], lambda M: L.householder_product(M, torch.tensor([1.2, 0.7, 1.5]))),
}

cases = {}
for name, (names, f) in CASES.items():
    xs = inputs()
    args = [xs[n].requires_grad_() for n in names]
    out = f(*args)
    outs = out if isinstance(out, tuple) else (out,)
    loss = 0
    for o in outs:
        if o.dtype.is_floating_point and o.requires_grad:
            loss = loss + (o * torch.cos(torch.arange(o.numel(), dtype=torch.float64)).reshape(o.shape)).sum()
    c = {"inputs": names, "y": outs[0].detach().reshape(-1).tolist(), "shape": list(outs[0].shape)}
    if len(outs) > 1:
        c["y2"] = outs[1].detach().reshape(-1).tolist()
    if torch.is_tensor(loss):   # a permutation alone has no gradient
        loss.backward()
        for n, a in zip(names, args):
            c["d" + n] = a.grad.reshape(-1).tolist()
    if name in ORMQR_CHECKS:
        assert torch.allclose(ORMQR_CHECKS[name](inputs()["B"]), outs[0], rtol=1e-13, atol=1e-14)
    cases[name] = c


def value(v):
    if isinstance(v, list) and v and isinstance(v[0], str):
        return "{" + ", ".join('"%s"' % x for x in v) + "}"
    return lua(v)


print_cases("gen_linalg_ref.py", cases, value)
