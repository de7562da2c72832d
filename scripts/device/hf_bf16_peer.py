#!/usr/bin/env python3
"""Hugging Face transformers in bf16 on the reference checkpoints, scored by the teacher-forced
rule of the goldens (tests/gpu/gpu_golden_test.cpp): the engine's peer under the same rule.

For every model of tests/data/reference/logits.json, each case is run teacher-forced on the
oracle's greedy ids (one causal forward over prompt + greedy ids, no cache, which gives the
same logits as a prefill followed by one decode step per id) with the model loaded in
torch_dtype=bfloat16 (and, as a check of the harness, in float32). Printed per model: the worst
last_logits max-norm relative error over the cases (max|got - ref| / max|ref|; the rule wants
<= 2e-2) and the generated steps whose argmax is outside the oracle's generated_top5 (the rule
wants none). stories260k, whose oracle is its greedy ids from BOS, is scored against this
harness's own float32 logits over its 256 positions (last position's error; steps outside the
float32 top-5).

Usage (repository root, on a machine with torch and transformers):
  python3 scripts/device/hf_bf16_peer.py [--device cuda] [--json out.json] [model ...]
"""
import argparse
import json
import os
import sys

import torch
import transformers

MODELS = [
    ("stories260k", "tests/data/reference/models/stories260k"),
    ("llama3-tiny", "tests/data/reference/models/llama3-tiny"),
    ("mistral-tiny", "tests/data/reference/models/mistral-tiny"),
    ("qwen2-tiny", "tests/data/reference/models/qwen2-tiny"),
    ("qwen3-tiny", "tests/data/reference/models/qwen3-tiny"),
    ("qwen3yarn-tiny", "tests/data/reference/models/qwen3yarn-tiny"),
    ("strata-demo", "models/strata-demo"),
    ("strata-demo-draft", "models/strata-demo-draft"),
    ("gemma2-tiny", "tests/data/reference/models/gemma2-tiny"),
    ("gemma3-tiny", "tests/data/reference/models/gemma3-tiny"),
    ("gemma3mm-tiny", "tests/data/reference/models/gemma3mm-tiny"),
    ("qwen3moe-tiny", "tests/data/reference/models/qwen3moe-tiny"),
    ("gemma4-tiny", "tests/data/reference/models/gemma4-tiny"),
    ("gemma4moe-tiny", "tests/data/reference/models/gemma4moe-tiny"),
]


def load(path, dtype, device):
    errors = []
    for cls in ("AutoModelForCausalLM", "AutoModelForImageTextToText"):
        try:
            m = getattr(transformers, cls).from_pretrained(path, dtype=dtype)
            return m.to(device).eval()
        except Exception as e:  # the next class may know the architecture
            errors.append(f"{cls}: {e}")
    raise RuntimeError(f"{path}: " + " | ".join(errors))


@torch.no_grad()
def logits_of(model, ids, device):
    x = torch.tensor([ids], dtype=torch.long, device=device)
    return model(input_ids=x).logits[0].float().cpu()


def max_norm_rel(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


def score_cases(model, cases, device):
    worst, off, steps = 0.0, 0, 0
    for c in cases:
        prompt, greedy = c["prompt_ids"], c["greedy_ids"]
        lg = logits_of(model, prompt + greedy[:-1], device)
        p = len(prompt)
        worst = max(worst, max_norm_rel(lg[p - 1], torch.tensor(c["last_logits"])))
        for i, top5 in enumerate(c["generated_top5"][: len(greedy)]):
            steps += 1
            off += int(int(lg[p - 1 + i].argmax()) not in top5)
    return worst, off, steps


def score_stories(model, ids, ref, device):
    lg = logits_of(model, ids, device)
    off = 0
    for t in range(len(ids)):
        off += int(int(lg[t].argmax()) not in ref[t].topk(5).indices.tolist())
    return max_norm_rel(lg[-1], ref[-1]), off, len(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--json", default="")
    ap.add_argument("models", nargs="*")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "tests/data/reference/logits.json")) as f:
        oracle = json.load(f)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print(f"{'model':18s} {'f32 err':>9s} {'f32 off':>9s} {'bf16 err':>9s} {'bf16 off':>12s}  rule (err <= 2e-2, off 0)")
    results = {}
    for name, rel in MODELS:
        if args.models and name not in args.models:
            continue
        path = os.path.join(root, rel)
        row = {}
        try:
            m32 = load(path, torch.float32, args.device)
            if name == "stories260k":
                ids = oracle[name]["greedy_from_bos_ids"][:-1]
                ref = logits_of(m32, ids, args.device)
                row["f32"] = score_stories(m32, ids, ref, args.device)
                del m32
                m16 = load(path, torch.bfloat16, args.device)
                row["bf16"] = score_stories(m16, ids, ref, args.device)
            else:
                cases = oracle[name]["cases"]
                row["f32"] = score_cases(m32, cases, args.device)
                del m32
                m16 = load(path, torch.bfloat16, args.device)
                row["bf16"] = score_cases(m16, cases, args.device)
            del m16
        except Exception as e:
            print(f"{name:18s} failed: {e}", file=sys.stderr)
            results[name] = {"error": str(e)}
            continue
        e32, o32, _ = row["f32"]
        e16, o16, n = row["bf16"]
        ok = "pass" if e16 <= 2e-2 and o16 == 0 else "FAIL"
        print(f"{name:18s} {e32:9.2e} {o32:9d} {e16:9.4f} {o16:5d} of {n:4d}  {ok}")
        sys.stdout.flush()
        results[name] = {"f32": {"err": e32, "off": o32}, "bf16": {"err": e16, "off": o16, "steps": n}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
