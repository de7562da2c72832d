"""Hugging Face transformers on the shapes of bench_cuda_llama: a Llama-3.1-8B-shaped model
built from a config with random bf16 weights on the GPU, sdpa attention, prefill of one
4096-token prompt (logits of the last token only, as strata computes), timed with CUDA events
(median of the timed repetitions after warm-up). Also one decode step at batch 1 after a
512-token prompt, with the KV cache, for reference.

Usage: python3 bench/cuda/hf_prefill.py [reps=5]
"""
import statistics
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    cfg = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072,
        rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    t0 = time.time()
    with torch.device("cuda"):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
        except TypeError:
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    torch.cuda.synchronize()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}: model built in "
          f"{time.time() - t0:.1f} s, {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B params", flush=True)

    n = 4096
    ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    with torch.inference_mode():
        for i in range(reps + 2):
            e0.record()
            try:
                out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
            except TypeError:
                out = model(input_ids=ids, use_cache=False)
            e1.record()
            torch.cuda.synchronize()
            if i >= 2:
                times.append(e0.elapsed_time(e1))
            del out
    ms = statistics.median(times)
    print(f"HF prefill 4096 (sdpa, bf16): median {ms:.1f} ms of {len(times)} -> {n / (ms * 1e-3):.0f} tok/s "
          f"(all: {', '.join(f'{t:.1f}' for t in times)})", flush=True)

    # Decode at batch 1 after 512 tokens (eager, KV cache), for reference.
    prompt = ids[:, :512]
    with torch.inference_mode():
        out = model(input_ids=prompt, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        steps = []
        for i in range(37):
            e0.record()
            out = model(input_ids=tok, past_key_values=past, use_cache=True)
            e1.record()
            torch.cuda.synchronize()
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
            if i >= 5:
                steps.append(e0.elapsed_time(e1))
    ms = statistics.median(steps)
    print(f"HF decode b=1 after 512 (eager): median step {ms:.2f} ms -> {1000.0 / ms:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
