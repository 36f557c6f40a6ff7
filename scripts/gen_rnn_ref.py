#!/usr/bin/python3
"""Writes tests/ref/rnn.lua: weights, inputs, outputs and gradients of
nn.RNN, nn.LSTM, nn.GRU and their cells for tests/lua/test_rnn.lua.

    /usr/bin/python3 scripts/gen_rnn_ref.py > tests/ref/rnn.lua

Every case runs in float64 with dropout 0. A case holds the module's class
(`kind`), its positional arguments (`args`), its options as the Lua
constructor takes them (`opts`), its state dict (`weights`), the inputs
(`x`, and `h0`/`c0` where given), for a packed batch its `lengths` and
`enforce_sorted` (the input packed with pack_padded_sequence, the output
padded again with pad_packed_sequence), the outputs (`out`, `h_n`, `c_n`), the
upstream gradients (`dout`, `dh`, `dc`) of loss = sum(out * dout) +
sum(h_n * dh) + sum(c_n * dc), and the gradients of the inputs and of
every parameter (`grads`, parameters as "param.NAME").
"""
import torch
import torch.nn as nn

torch.manual_seed(20261207)
torch.set_default_dtype(torch.float64)

LAYERS = {"RNN": nn.RNN, "LSTM": nn.LSTM, "GRU": nn.GRU}
CELLS = {"RNNCell": nn.RNNCell, "LSTMCell": nn.LSTMCell, "GRUCell": nn.GRUCell}


def leaf(*shape):
    return torch.randn(*shape, requires_grad=True)


def case(kind, args, opts, x, h0=None, c0=None, lengths=None, enforce_sorted=True):
    cls = LAYERS.get(kind) or CELLS[kind]
    m = cls(*args, **opts)
    lstm = kind.startswith("LSTM")
    inputs = {"x": x}
    if h0 is not None:
        inputs["h0"] = h0
    if c0 is not None:
        inputs["c0"] = c0
    hx = (h0, c0) if lstm and h0 is not None else h0
    if lengths is not None:   # packed: the output padded again, zeros past each end
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=opts.get("batch_first", False),
                                                   enforce_sorted=enforce_sorted)
        out, state = m(packed, hx)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=opts.get("batch_first", False))
        h_n, c_n = state if lstm else (state, None)
    elif kind in LAYERS:
        out, state = m(x, hx)
        h_n, c_n = state if lstm else (state, None)
    else:
        state = m(x, hx)
        out, h_n, c_n = (state[0], None, state[1]) if lstm else (state, None, None)
    c = {"kind": kind, "args": list(args), "opts": opts, "inputs": inputs, "out": out}
    if lengths is not None:
        c["lengths"], c["enforce_sorted"] = list(lengths), enforce_sorted
    loss = 0
    for key, t in (("out", out), ("h_n", h_n), ("c_n", c_n)):
        if t is None:
            continue
        c[key] = t
        d = torch.randn(t.shape)
        c["d" + key] = d
        loss = loss + (t * d).sum()
    loss.backward()
    c["weights"] = dict(m.state_dict())
    grads = {k: v.grad for k, v in inputs.items()}
    grads.update({"param." + k: p.grad for k, p in m.named_parameters()})
    c["grads"] = grads
    return c


def cases():
    T, N, I, H = 4, 3, 5, 4
    c = {}
    c["lstm_2layer_bidir_h0"] = case("LSTM", (I, H, 2), {"bidirectional": True},
                                     leaf(T, N, I), leaf(4, N, H), leaf(4, N, H))
    c["lstm_batch_first_proj"] = case("LSTM", (I, 6, 2), {"batch_first": True, "proj_size": 3}, leaf(N, T, I))
    c["lstm_unbatched_h0"] = case("LSTM", (I, H), {}, leaf(T, I), leaf(1, H), leaf(1, H))
    c["lstm_no_bias_bidir_batch_first"] = case("LSTM", (I, H), {"bias": False, "bidirectional": True,
                                                                 "batch_first": True}, leaf(N, T, I))
    c["gru_2layer_bidir_batch_first_h0"] = case("GRU", (I, H, 2), {"bidirectional": True, "batch_first": True},
                                                leaf(N, T, I), leaf(4, N, H))
    c["gru_unbatched_no_bias"] = case("GRU", (I, H), {"bias": False}, leaf(T, I))
    c["gru_2layer"] = case("GRU", (I, H, 2), {}, leaf(T, N, I))
    c["rnn_tanh_2layer_h0"] = case("RNN", (I, H, 2), {}, leaf(T, N, I), leaf(2, N, H))
    c["rnn_relu_bidir_batch_first"] = case("RNN", (I, H), {"nonlinearity": "relu", "bidirectional": True,
                                                          "batch_first": True}, leaf(N, T, I))
    c["rnn_unbatched_2layer_bidir"] = case("RNN", (I, H, 2), {"bidirectional": True}, leaf(T, I), leaf(4, H))
    c["lstm_cell_h0"] = case("LSTMCell", (I, H), {}, leaf(N, I), leaf(N, H), leaf(N, H))
    c["lstm_cell_unbatched"] = case("LSTMCell", (I, H), {}, leaf(I))
    c["gru_cell_h0"] = case("GRUCell", (I, H), {}, leaf(N, I), leaf(N, H))
    c["gru_cell_no_bias_unbatched"] = case("GRUCell", (I, H), {"bias": False}, leaf(I), leaf(H))
    c["rnn_cell_relu_h0"] = case("RNNCell", (I, H), {"nonlinearity": "relu"}, leaf(N, I), leaf(N, H))
    c["rnn_cell_tanh"] = case("RNNCell", (I, H), {}, leaf(N, I))
    # packed batches: sorted and not, both directions, every kind
    c["packed_lstm_2layer_bidir_unsorted_h0"] = case("LSTM", (I, H, 2), {"bidirectional": True}, leaf(T, N, I),
                                                     leaf(4, N, H), leaf(4, N, H), lengths=[2, 4, 3],
                                                     enforce_sorted=False)
    c["packed_lstm_batch_first_sorted"] = case("LSTM", (I, H), {"batch_first": True}, leaf(N, T, I),
                                               lengths=[4, 3, 1])
    c["packed_lstm_proj_unsorted"] = case("LSTM", (I, 6), {"proj_size": 3}, leaf(T, N, I), lengths=[1, 4, 2],
                                          enforce_sorted=False)
    c["packed_gru_bidir_batch_first_unsorted"] = case("GRU", (I, H), {"bidirectional": True, "batch_first": True},
                                                      leaf(N, T, I), leaf(2, N, H), lengths=[3, 1, 4],
                                                      enforce_sorted=False)
    c["packed_rnn_relu_2layer"] = case("RNN", (I, H, 2), {"nonlinearity": "relu"}, leaf(T, N, I),
                                       lengths=[4, 4, 2])
    return c


def lua(v, indent):
    if isinstance(v, torch.Tensor):
        shape = ", ".join(map(str, v.shape))
        return "{shape = {%s}, %s}" % (shape, ", ".join("%.17g" % x for x in v.detach().flatten().tolist()))
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"%s"' % v
    if isinstance(v, (int, float)):
        return "%.17g" % v
    if isinstance(v, list):
        return "{" + ", ".join(lua(x, indent) for x in v) + "}"
    if isinstance(v, dict):
        pad = "  " * (indent + 1)
        items = ["%s[\"%s\"] = %s," % (pad, k, lua(v[k], indent + 1)) for k in sorted(v) if v[k] is not None]
        return "{\n" + "\n".join(items) + "\n" + "  " * indent + "}"
    raise TypeError(type(v))


print("-- generated by scripts/gen_rnn_ref.py with torch " + torch.__version__ + "; do not edit")
print("return " + lua(cases(), 0))
