#!/usr/bin/env python3
"""Times Hugging Face `tokenizers` on the text bench_tokenizer encodes, single-threaded,
and prints strata's speed as a ratio to it; also checks both produce the same ids.

  build/bench/bench_tokenizer --dump-text text.txt --json strata.json
  python3 bench/compare_tokenizers.py --text text.txt --strata strata.json \
      [--tokenizers tests/data/reference/tokenizers] [--only qwen3,llama3] [--runs 3]

The text is split into the same paragraphs (each ends with its "\\n\\n") and encoded
without special tokens, as the bench does. Needs `pip install tokenizers`.
"""
import argparse
import json
import lzma
import os
import sys
import time

# Single thread for the Rust side too (set before tokenizers is imported).
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tokenizers import Tokenizer  # noqa: E402


def load_json_text(dirpath):
    plain = os.path.join(dirpath, "tokenizer.json")
    if os.path.exists(plain):
        with open(plain, encoding="utf-8") as f:
            return f.read()
    with lzma.open(plain + ".xz", "rt", encoding="utf-8") as f:
        return f.read()


def split_paragraphs(text):
    parts = text.split("\n\n")
    # Every paragraph of the bench ends with "\n\n": the split leaves an empty tail.
    return [p + "\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def fnv1a_ids(all_ids):
    h = 1469598103934665603
    for ids in all_ids:
        for i in ids:
            for b in range(4):
                h ^= (i >> (8 * b)) & 0xFF
                h = (h * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return "%x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--text", required=True, help="file written by bench_tokenizer --dump-text")
    ap.add_argument("--strata", help="file written by bench_tokenizer --json")
    ap.add_argument("--tokenizers", default="tests/data/reference/tokenizers")
    ap.add_argument("--only", default="qwen3,llama3,gemma3,llama2,deepseek_v3,gptoss")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()

    with open(args.text, encoding="utf-8", newline="") as f:
        text = f.read()
    paragraphs = split_paragraphs(text)
    total_bytes = len(text.encode("utf-8"))
    strata = {}
    if args.strata:
        with open(args.strata) as f:
            strata = json.load(f)["tokenizers"]

    print(f"text: {len(paragraphs)} paragraphs, {total_bytes / 1048576:.2f} MB")
    print(f"{'tokenizer':<12} {'hf_load_s':>9} {'hf_MB/s':>9} {'strata_MB/s':>11} {'ratio':>7} {'ids':>6}")
    failed = False
    for name in args.only.split(","):
        json_text = load_json_text(os.path.join(args.tokenizers, name))
        t0 = time.perf_counter()
        tok = Tokenizer.from_str(json_text)
        load_s = time.perf_counter() - t0
        best = float("inf")
        all_ids = None
        for _ in range(args.runs):
            t0 = time.perf_counter()
            encs = tok.encode_batch(paragraphs, add_special_tokens=False)
            best = min(best, time.perf_counter() - t0)
            all_ids = [e.ids for e in encs]
        hf_mbps = total_bytes / 1048576 / best
        s = strata.get(name)
        if s:
            same = s["ids_fnv1a"] == fnv1a_ids(all_ids)
            failed |= not same
            print(f"{name:<12} {load_s:9.3f} {hf_mbps:9.2f} {s['mb_per_s']:11.2f} {s['mb_per_s'] / hf_mbps:7.2f} "
                  f"{'same' if same else 'DIFFER':>6}")
        else:
            print(f"{name:<12} {load_s:9.3f} {hf_mbps:9.2f} {'-':>11} {'-':>7} {'-':>6}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
