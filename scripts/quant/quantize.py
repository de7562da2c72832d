#!/usr/bin/env python3
"""Writes a quantized copy of a Hugging Face checkpoint in one of the formats strata reads, and
(with --dequantized) the same model with every quantized weight replaced by its exact f32
dequantization, so a test can check that strata's reading of the packed format equals the plain
f32 model. Round-to-nearest quantization, no calibration; numpy only; deterministic.

Formats (the layouts of each format's own public code):
  fp8-ct   compressed-tensors float-quantized: float8_e4m3fn weight + weight_scale
           (--strategy tensor: [1], channel: [out, 1]); lm_head ignored.
  mlx      mlx-lm affine: uint32 weight packing 32/bits codes lowest bits first, scales and
           biases [out, in/group] (bf16); embeddings and lm_head quantized too; --override
           MODULE=BITS:GROUP writes a per-module entry into `quantization`.
  awq      AutoAWQ GEMM: qweight [in, out/8] int32 with nibble order [0,2,4,6,1,3,5,7], qzeros
           [in/group, out/8] packed the same, scales [in/group, out] f16; asymmetric 4-bit.
  gptq     AutoGPTQ: qweight [in/(32/bits), out], qzeros [groups, out/(32/bits)] storing
           zero - 1, scales [groups, out] f16, g_idx [in]; --sym, --act-order (a seeded
           permutation decides the groups).

Usage: quantize.py --format F --model SRC --out DIR [--dequantized DIR] [--bits B]
       [--group-size G] [--strategy tensor|channel] [--sym] [--act-order] [--override M=B:G]
"""
import argparse
import json
import os
import re
import shutil
import struct
import sys

import numpy as np

# The linear layers quantized: attention, MLP and expert projections, DeltaNet's fused inputs
# and output (the small in_proj_a/b/ba, the router and norms stay float).
LINEAR = re.compile(r"\.((q|k|v|o|gate|up|down)_proj|in_proj_(qkvz|qkv|z)|out_proj)\.weight$")

# ---------------------------------------------------------------- safetensors (numpy)

NP_OF = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32, "U32": np.uint32,
         "F8_E4M3": np.uint8, "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    """{name: (dtype, array)}; BF16 and F8_E4M3 come back as their raw bits."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        arr = np.frombuffer(data[base + a:base + b], dtype=NP_OF[e["dtype"]]).reshape(e["shape"])
        out[name] = (e["dtype"], arr)
    return out


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, array)} written in name order."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def to_f32(dtype, arr):
    if dtype == "F32":
        return arr.astype(np.float32)
    if dtype == "F16":
        return arr.astype(np.float32)
    if dtype == "BF16":
        return (arr.astype(np.uint32) << 16).view(np.float32)
    raise SystemExit(f"tensor dtype {dtype} is not a float")


def bf16_bits(x):
    """Round-to-nearest-even f32 -> bf16 bits."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = u + 0x7FFF + ((u >> 16) & 1)
    return (u >> 16).astype(np.uint16)


# ---------------------------------------------------------------- formats


def e4m3fn_values():
    """The value of every float8_e4m3fn code (NaN codes as nan)."""
    v = np.zeros(256, dtype=np.float32)
    for b in range(256):
        e, m = (b >> 3) & 15, b & 7
        if e == 15 and m == 7:
            v[b] = np.nan
            continue
        mag = m * 2.0 ** -9 if e == 0 else (8 + m) * 2.0 ** (e - 10)
        v[b] = -mag if b & 0x80 else mag
    return v


def fp8_encode(x):
    """Nearest float8_e4m3fn code of each value (|x| <= 448)."""
    vals = e4m3fn_values()
    pos = vals[:0x7F]  # codes 0..126: 0 .. 448, increasing
    a = np.abs(x).astype(np.float32)
    hi = np.clip(np.searchsorted(pos, a), 1, len(pos) - 1)
    lo = hi - 1
    code = np.where(a - pos[lo] <= pos[hi] - a, lo, hi).astype(np.uint8)
    return np.where(x < 0, code | 0x80, code).astype(np.uint8), vals


def quant_fp8_ct(w, strategy):
    amax = np.abs(w).max() if strategy == "tensor" else np.abs(w).max(axis=1, keepdims=True)
    scale = (np.maximum(amax, 1e-12) / 448.0).astype(np.float32)
    codes, vals = fp8_encode(w / scale)
    scale_t = scale.reshape(1) if strategy == "tensor" else scale.reshape(-1, 1)
    deq = (vals[codes] * scale_t).astype(np.float32)
    return {".weight": ("F8_E4M3", codes), ".weight_scale": ("F32", scale_t)}, deq


def asym_groups(w, bits, group):
    """Per (row, group) min/max affine codes along the last axis: q, scale, minimum."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    lo, hi = g.min(axis=2), g.max(axis=2)
    scale = np.maximum(hi - lo, 1e-8) / (2 ** bits - 1)
    return g, scale.astype(np.float32), lo.astype(np.float32)


def pack_lsb_first(codes, bits, axis):
    """Packs 32/bits codes along `axis` into uint32 words, code k at bits [k*bits, (k+1)*bits)."""
    per = 32 // bits
    c = np.moveaxis(codes.astype(np.uint32), axis, -1)
    c = c.reshape(c.shape[:-1] + (c.shape[-1] // per, per))
    words = np.zeros(c.shape[:-1], dtype=np.uint32)
    for k in range(per):
        words |= c[..., k] << np.uint32(k * bits)
    return np.moveaxis(words, -1, axis)


def quant_mlx(w, bits, group):
    rows, cols = w.shape
    g, scale, lo = asym_groups(w, bits, group)
    # Scales and biases are stored as bf16 (the checkpoint dtype); codes use the stored values.
    s_bits, b_bits = bf16_bits(scale), bf16_bits(lo)
    s, b = to_f32("BF16", s_bits), to_f32("BF16", b_bits)
    q = np.clip(np.rint((g - b[:, :, None]) / s[:, :, None]), 0, 2 ** bits - 1).astype(np.uint32)
    deq = (s[:, :, None] * q.astype(np.float32) + b[:, :, None]).astype(np.float32).reshape(rows, cols)
    packed = pack_lsb_first(q.reshape(rows, cols), bits, axis=1)
    return {".weight": ("U32", packed), ".scales": ("BF16", s_bits), ".biases": ("BF16", b_bits)}, deq


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a word holds column AWQ_ORDER[i] of its 8


def awq_pack(codes):
    """codes [n, out] -> [n, out/8] int32 in AutoAWQ's GEMM nibble order."""
    n, out = codes.shape
    c = codes.astype(np.uint32).reshape(n, out // 8, 8)
    words = np.zeros((n, out // 8), dtype=np.uint32)
    for i in range(8):
        words |= c[:, :, AWQ_ORDER[i]] << np.uint32(4 * i)
    return words.view(np.int32)


def quant_awq(w, group):
    rows, cols = w.shape  # [out, in]
    wt = w.T.copy()       # [in, out]
    g = wt.reshape(cols // group, group, rows)
    lo, hi = g.min(axis=1), g.max(axis=1)  # [groups, out]
    scale = (np.maximum(hi - lo, 1e-8) / 15).astype(np.float16)
    s = scale.astype(np.float32)
    zero = np.clip(np.rint(-lo / s), 0, 15).astype(np.int64)
    q = np.clip(np.rint(g / s[:, None, :]) + zero[:, None, :], 0, 15).astype(np.int64)
    deq_t = ((q - zero[:, None, :]).astype(np.float32) * s[:, None, :]).reshape(cols, rows)
    tensors = {".qweight": ("I32", awq_pack(q.reshape(cols, rows))), ".qzeros": ("I32", awq_pack(zero)),
               ".scales": ("F16", scale)}
    return tensors, np.ascontiguousarray(deq_t.T).astype(np.float32)


def quant_gptq(w, bits, group, sym, act_order, rng):
    rows, cols = w.shape
    maxq = 2 ** bits - 1
    n_groups = (cols + group - 1) // group
    if act_order:
        perm = rng.permutation(cols)  # quantization order; groups follow it
        g_idx = np.empty(cols, dtype=np.int32)
        g_idx[perm] = np.arange(cols) // group
    else:
        g_idx = (np.arange(cols) // group).astype(np.int32)
    wt = w.T  # [in, out]
    scale = np.zeros((n_groups, rows), dtype=np.float16)
    zero = np.zeros((n_groups, rows), dtype=np.int64)
    for gi in range(n_groups):
        sel = wt[g_idx == gi]
        if sym:
            s = np.maximum(np.abs(sel).max(axis=0), 1e-8) / ((maxq - 1) / 2)
            z = np.full(rows, (maxq + 1) // 2)
        else:
            lo, hi = sel.min(axis=0), sel.max(axis=0)
            s = np.maximum(hi - lo, 1e-8) / maxq
            # The gptq format stores zero - 1 in `bits` bits: keep zero >= 1 so it never wraps.
            z = np.clip(np.rint(-lo / s.astype(np.float16).astype(np.float32)), 1, maxq)
        scale[gi] = s.astype(np.float16)
        zero[gi] = z
    s32 = scale.astype(np.float32)
    q = np.clip(np.rint(wt / s32[g_idx]) + zero[g_idx], 0, maxq).astype(np.int64)  # [in, out]
    deq_t = (q - zero[g_idx]).astype(np.float32) * s32[g_idx]
    qweight = pack_lsb_first(q, bits, axis=0).view(np.int32)                 # [in/per, out]
    qzeros = pack_lsb_first(zero - 1, bits, axis=1).view(np.int32)           # [groups, out/per]
    tensors = {".qweight": ("I32", qweight), ".qzeros": ("I32", qzeros), ".scales": ("F16", scale),
               ".g_idx": ("I32", g_idx)}
    return tensors, np.ascontiguousarray(deq_t.T).astype(np.float32)


# ---------------------------------------------------------------- driver


def quantized_config(args, overrides):
    if args.format == "fp8-ct":
        return {"quantization_config": {
            "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": args.strategy, "symmetric": True,
                            "dynamic": False, "group_size": None},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "symmetric": True,
                                      "dynamic": True}}},
            "ignore": ["lm_head"]}}
    if args.format == "mlx":
        q = {"group_size": args.group_size, "bits": args.bits}
        for m, (b, g) in overrides.items():
            q[m] = {"group_size": g, "bits": b}
        return {"quantization": q, "quantization_config": dict(q)}
    if args.format == "awq":
        return {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": args.group_size,
                                        "version": "gemm", "zero_point": True, "modules_to_not_convert": None}}
    return {"quantization_config": {"quant_method": "gptq", "bits": args.bits, "group_size": args.group_size,
                                    "sym": args.sym, "desc_act": args.act_order, "checkpoint_format": "gptq",
                                    "damp_percent": 0.01, "static_groups": False, "true_sequential": True}}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", required=True, choices=["fp8-ct", "mlx", "awq", "gptq"])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dequantized")
    p.add_argument("--bits", type=int, default=4)
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--strategy", default="channel", choices=["tensor", "channel"])
    p.add_argument("--sym", action="store_true")
    p.add_argument("--act-order", action="store_true")
    p.add_argument("--override", action="append", default=[], help="mlx: MODULE=BITS:GROUP")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    if args.format == "awq" and args.bits != 4:
        raise SystemExit("awq: --bits must be 4")
    overrides = {}
    for o in args.override:
        m, bg = o.split("=")
        b, g = bg.split(":")
        overrides[m] = (int(b), int(g))
    rng = np.random.default_rng(args.seed)

    src = read_safetensors(os.path.join(args.model, "model.safetensors"))
    quant, deq = {}, {}
    for name in sorted(src):
        dtype, arr = src[name]
        targeted = LINEAR.search(name) is not None and ".layers." in name
        if args.format == "mlx":
            targeted = targeted or name.endswith("embed_tokens.weight") or name == "lm_head.weight"
        if not targeted or arr.ndim != 2:
            quant[name] = (dtype, arr)
            deq[name] = (dtype, arr)
            continue
        w = to_f32(dtype, arr)
        module = name[: -len(".weight")]
        if args.format == "fp8-ct":
            t, d = quant_fp8_ct(w, args.strategy)
        elif args.format == "mlx":
            b, g = overrides.get(module, (args.bits, args.group_size))
            t, d = quant_mlx(w, b, g)
        elif args.format == "awq":
            t, d = quant_awq(w, args.group_size)
        else:
            t, d = quant_gptq(w, args.bits, args.group_size, args.sym, args.act_order, rng)
        for suffix, v in t.items():
            quant[module + suffix] = v
        deq[name] = ("F32", d)

    with open(os.path.join(args.model, "config.json")) as f:
        config = json.load(f)
    for d in [args.out] + ([args.dequantized] if args.dequantized else []):
        os.makedirs(d, exist_ok=True)
        for extra in ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]:
            if os.path.exists(os.path.join(args.model, extra)):
                shutil.copy(os.path.join(args.model, extra), d)
    qc = dict(config)
    qc.update(quantized_config(args, overrides))
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(qc, f, indent=2)
    write_safetensors(os.path.join(args.out, "model.safetensors"), quant)
    if args.dequantized:
        with open(os.path.join(args.dequantized, "config.json"), "w") as f:
            json.dump(config, f, indent=2)
        write_safetensors(os.path.join(args.dequantized, "model.safetensors"), deq)
    return 0


if __name__ == "__main__":
    sys.exit(main())
