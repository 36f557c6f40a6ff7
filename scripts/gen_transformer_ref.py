#!/usr/bin/python3
"""Writes tests/ref/transformer.lua: weights, inputs, outputs and gradients
of nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerEncoder,
nn.TransformerDecoderLayer, nn.TransformerDecoder and nn.Transformer for
tests/lua/test_transformer.lua.

    /usr/bin/python3 scripts/gen_transformer_ref.py > tests/ref/transformer.lua

Every case runs in float64 with dropout 0. torch 1.13 predates the
is_causal arguments and the bias option of the layers, so:
- a case whose Lua side passes is_causal=true passes PyTorch the causal
  mask (is_causal is documented as a hint that the mask is the causal one);
- bias=False is built as a layer with biases that are zero and take no
  gradient: the same function, and the biases are left out of the file.
A case holds the module's options (`opts`, as the Lua constructor takes
them), its state dict (`weights`), the inputs, the forward's options as
Lua takes them (`fwd`, with masks as tensors), the outputs, the upstream
gradients (`dout`, `dweights`) and the gradients of the inputs and of every
parameter (`grads`).
"""
import torch
import torch.nn as nn

torch.manual_seed(20261206)
torch.set_default_dtype(torch.float64)


def causal(L, S):
    return torch.ones(L, S, dtype=torch.bool).triu(1)


def padding(N, S, lengths):
    m = torch.zeros(N, S, dtype=torch.bool)
    for n, length in enumerate(lengths):
        m[n, length:] = True
    return m


def params_of(module, drop_bias):
    return {k: v for k, v in module.named_parameters() if not (drop_bias and k.endswith("bias"))}


def no_bias(module):
    # bias=False in torch 1.13: biases held at zero, without gradients
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            p.requires_grad_(False)
            p.data.zero_()


def finish(case, module, inputs, outs, drop_bias=False):
    """Backward of sum(out * dout) (+ sum(weights * dweights)); fills the case."""
    out = outs[0]
    dout = torch.randn(out.shape)
    loss = (out * dout).sum()
    case["dout"] = dout
    case["out"] = out
    if len(outs) > 1 and outs[1] is not None:
        dw = torch.randn(outs[1].shape)
        loss = loss + (outs[1] * dw).sum()
        case["weights_out"] = outs[1]
        case["dweights"] = dw
    loss.backward()
    params = params_of(module, drop_bias)
    case["weights"] = {k: v for k, v in module.state_dict().items() if not (drop_bias and k.endswith("bias"))}
    case["inputs"] = inputs
    grads = {k: v.grad for k, v in inputs.items()}
    grads.update({"param." + k: p.grad for k, p in params.items()})
    case["grads"] = grads
    return case


def leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


def mha_case(E, H, opts, inputs, fwd_torch, fwd_lua, self_attn=False):
    kw = dict(opts)
    m = nn.MultiheadAttention(E, H, **kw)
    if self_attn:
        x = inputs["x"]
        outs = m(x, x, x, **fwd_torch)
    else:
        outs = m(inputs["query"], inputs["key"], inputs["value"], **fwd_torch)
    case = {"kind": "mha", "E": E, "H": H, "opts": opts, "fwd": fwd_lua}
    if not fwd_torch.get("need_weights", True):
        outs = (outs[0], None)
    return finish(case, m, inputs, outs)


def layer_case(d, H, opts, inputs, fwd_torch, fwd_lua, num_layers=None, final_norm=False):
    kw = {k: v for k, v in opts.items() if k != "bias"}
    layer = nn.TransformerEncoderLayer(d, H, dropout=0.0, **kw)
    drop_bias = opts.get("bias") is False
    if num_layers is None:
        module = layer
        kind = "layer"
    else:
        module = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d) if final_norm else None,
                                       enable_nested_tensor=False)
        kind = "encoder"
    if drop_bias:
        no_bias(module)
    out = module(inputs["src"], **fwd_torch)
    case = {"kind": kind, "E": d, "H": H, "opts": dict(opts, dropout=0.0), "fwd": fwd_lua,
            "num_layers": num_layers, "final_norm": final_norm}
    return finish(case, module, inputs, (out,), drop_bias)


def decoder_case(d, H, opts, inputs, fwd_torch, fwd_lua, num_layers=None, final_norm=False):
    kw = {k: v for k, v in opts.items() if k != "bias"}
    layer = nn.TransformerDecoderLayer(d, H, dropout=0.0, **kw)
    drop_bias = opts.get("bias") is False
    if num_layers is None:
        module, kind = layer, "dlayer"
    else:
        module = nn.TransformerDecoder(layer, num_layers, norm=nn.LayerNorm(d) if final_norm else None)
        kind = "decoder"
    if drop_bias:
        no_bias(module)
    out = module(inputs["tgt"], inputs["memory"], **fwd_torch)
    case = {"kind": kind, "E": d, "H": H, "opts": dict(opts, dropout=0.0), "fwd": fwd_lua,
            "num_layers": num_layers, "final_norm": final_norm}
    return finish(case, module, inputs, (out,), drop_bias)


def transformer_case(opts, inputs, fwd_torch, fwd_lua):
    module = nn.Transformer(dropout=0.0, **opts)
    out = module(inputs["src"], inputs["tgt"], **fwd_torch)
    case = {"kind": "transformer", "opts": dict(opts, dropout=0.0), "fwd": fwd_lua}
    return finish(case, module, inputs, (out,))


def cases():
    c = {}
    N, L, S, E, H = 3, 5, 6, 8, 2

    x = leaf(N, L, E)
    c["mha_self_batch_first"] = mha_case(E, H, {"batch_first": True}, {"x": x}, {}, {}, self_attn=True)

    q, k, v = leaf(L, N, E), leaf(S, N, E), leaf(S, N, E)
    kpm = padding(N, S, [6, 4, 5])
    am = torch.rand(L, S) > 0.7
    am[:, 0] = False
    c["mha_seq_first_masks"] = mha_case(
        E, H, {}, {"query": q, "key": k, "value": v},
        {"key_padding_mask": kpm, "attn_mask": am, "need_weights": False},
        {"key_padding_mask": kpm, "attn_mask": am, "need_weights": False})

    q, k, v = leaf(N, L, E), leaf(N, S, 6), leaf(N, S, 4)
    fm = torch.randn(N * H, L, S)
    c["mha_cross_kdim_vdim"] = mha_case(
        E, H, {"batch_first": True, "kdim": 6, "vdim": 4}, {"query": q, "key": k, "value": v},
        {"attn_mask": fm, "average_attn_weights": False},
        {"attn_mask": fm, "average_attn_weights": False})

    q, k, v = leaf(L, E), leaf(S, E), leaf(S, E)
    fk = torch.randn(S)
    c["mha_unbatched_no_bias"] = mha_case(
        E, H, {"bias": False}, {"query": q, "key": k, "value": v},
        {"key_padding_mask": fk}, {"key_padding_mask": fk})

    x = leaf(N, L, E)
    c["mha_causal"] = mha_case(
        E, H, {"batch_first": True}, {"x": x},
        {"attn_mask": causal(L, L), "need_weights": False},
        {"is_causal": True, "need_weights": False}, self_attn=True)

    src = leaf(N, L, E)
    kpm = padding(N, L, [5, 3, 4])
    c["layer_post_relu_batch_first"] = layer_case(
        E, H, {"dim_feedforward": 16, "batch_first": True}, {"src": src},
        {"src_key_padding_mask": kpm}, {"src_key_padding_mask": kpm})

    src = leaf(L, N, E)
    c["layer_pre_gelu_causal"] = layer_case(
        E, H, {"dim_feedforward": 16, "activation": "gelu", "norm_first": True}, {"src": src},
        {"src_mask": causal(L, L)}, {"is_causal": True})

    src = leaf(N, L, E)
    fm = torch.randn(L, L)
    c["layer_no_bias_float_mask"] = layer_case(
        E, H, {"dim_feedforward": 12, "batch_first": True, "norm_first": True, "bias": False,
               "layer_norm_eps": 1e-6}, {"src": src},
        {"src_mask": fm}, {"src_mask": fm})

    src = leaf(N, L, E)
    kpm = padding(N, L, [5, 2, 4])
    c["encoder_causal_padding_norm"] = layer_case(
        E, H, {"dim_feedforward": 16, "activation": "gelu", "batch_first": True}, {"src": src},
        {"mask": causal(L, L), "src_key_padding_mask": kpm}, {"is_causal": True, "src_key_padding_mask": kpm},
        num_layers=2, final_norm=True)

    T = 4
    tgt, mem = leaf(N, T, E), leaf(N, S, E)
    tkpm, mkpm = padding(N, T, [4, 3, 2]), padding(N, S, [6, 5, 3])
    c["dlayer_post_relu_causal_padding"] = decoder_case(
        E, H, {"dim_feedforward": 16, "batch_first": True}, {"tgt": tgt, "memory": mem},
        {"tgt_mask": causal(T, T), "tgt_key_padding_mask": tkpm, "memory_key_padding_mask": mkpm},
        {"tgt_is_causal": True, "tgt_key_padding_mask": tkpm, "memory_key_padding_mask": mkpm})

    tgt, mem = leaf(T, N, E), leaf(S, N, E)
    fm, bm = torch.randn(T, S), torch.rand(T, T) > 0.6
    bm[:, 0] = False
    c["dlayer_pre_gelu_float_memory_mask"] = decoder_case(
        E, H, {"dim_feedforward": 12, "activation": "gelu", "norm_first": True, "layer_norm_eps": 1e-6},
        {"tgt": tgt, "memory": mem}, {"tgt_mask": bm, "memory_mask": fm}, {"tgt_mask": bm, "memory_mask": fm})

    tgt, mem = leaf(N, T, E), leaf(N, S, E)
    c["dlayer_no_bias_memory_causal"] = decoder_case(
        E, H, {"dim_feedforward": 16, "batch_first": True, "bias": False}, {"tgt": tgt, "memory": mem},
        {"memory_mask": causal(T, S)}, {"memory_is_causal": True})

    tgt, mem = leaf(N, T, E), leaf(N, S, E)
    c["decoder_two_layers_norm"] = decoder_case(
        E, H, {"dim_feedforward": 16, "batch_first": True, "norm_first": True}, {"tgt": tgt, "memory": mem},
        {"tgt_mask": causal(T, T), "memory_key_padding_mask": mkpm},
        {"tgt_is_causal": True, "memory_key_padding_mask": mkpm}, num_layers=2, final_norm=True)

    src, tgt = leaf(N, S, E), leaf(N, T, E)
    square = nn.Transformer.generate_square_subsequent_mask(T)
    skpm = padding(N, S, [6, 4, 5])
    c["transformer_batch_first"] = transformer_case(
        {"d_model": E, "nhead": H, "num_encoder_layers": 2, "num_decoder_layers": 1, "dim_feedforward": 16,
         "batch_first": True},
        {"src": src, "tgt": tgt},
        {"tgt_mask": square, "src_key_padding_mask": skpm, "memory_key_padding_mask": skpm},
        {"tgt_mask": square, "src_key_padding_mask": skpm, "memory_key_padding_mask": skpm})

    src, tgt = leaf(S, N, E), leaf(T, N, E)
    c["transformer_seq_first_norm_first_gelu"] = transformer_case(
        {"d_model": E, "nhead": H, "num_encoder_layers": 1, "num_decoder_layers": 2, "dim_feedforward": 12,
         "activation": "gelu", "norm_first": True},
        {"src": src, "tgt": tgt}, {"tgt_mask": causal(T, T)}, {"tgt_is_causal": True})
    q, k, v = leaf(L, N, E), leaf(S, N, E), leaf(S, N, E)
    kpm = padding(N, S, [6, 3, 5])
    am = torch.rand(L, S) > 0.7
    am[:, 0] = False
    c["mha_bias_kv_zero_attn_masks"] = mha_case(
        E, H, {"add_bias_kv": True, "add_zero_attn": True}, {"query": q, "key": k, "value": v},
        {"key_padding_mask": kpm, "attn_mask": am}, {"key_padding_mask": kpm, "attn_mask": am})

    x = leaf(N, L, E)
    c["mha_bias_kv_no_weights"] = mha_case(
        E, H, {"add_bias_kv": True, "batch_first": True}, {"x": x},
        {"need_weights": False}, {"need_weights": False}, self_attn=True)

    x = leaf(N, L, E)
    c["mha_zero_attn_causal"] = mha_case(
        E, H, {"add_zero_attn": True, "batch_first": True}, {"x": x},
        {"attn_mask": causal(L, L), "need_weights": False}, {"is_causal": True, "need_weights": False},
        self_attn=True)

    return c


def number(x):
    if x in (float("inf"), float("-inf")):
        return "math.huge" if x > 0 else "-math.huge"
    return "%.17g" % x


def lua(v, indent):
    if isinstance(v, torch.Tensor):
        shape = ", ".join(map(str, v.shape))
        if v.dtype == torch.bool:
            return "{shape = {%s}, bool = {%s}}" % (shape, ", ".join("true" if b else "false" for b in v.flatten().tolist()))
        return "{shape = {%s}, %s}" % (shape, ", ".join(number(x) for x in v.detach().flatten().tolist()))
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "nil"
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, (int, float)):
        return number(v)
    if isinstance(v, dict):
        pad = "  " * (indent + 1)
        items = ["%s[\"%s\"] = %s," % (pad, k, lua(v[k], indent + 1)) for k in sorted(v) if v[k] is not None]
        return "{\n" + "\n".join(items) + "\n" + "  " * indent + "}"
    raise TypeError(type(v))


print("-- generated by scripts/gen_transformer_ref.py with torch " + torch.__version__ + "; do not edit")
print("return " + lua(cases(), 0))
