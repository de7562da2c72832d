#!/usr/bin/env bash
# Sourced by the device scripts: make_llama8b_dummy prints a fresh directory holding a
# Llama-3.1-8B-shaped config.json (32 layers, hidden 4096, FFN 14336, 32/8 heads, vocab 128256,
# untied, llama3 RoPE) and the llama3 tokenizer from tests/data/reference, for
# `strata serve --load-format dummy` (weights drawn on the device). Run from the repository root.
make_llama8b_dummy() {
  local model
  model=$(mktemp -d /tmp/llama8b-dummy-XXXXXX)
  cat >"$model/config.json" <<'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
 "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
 "vocab_size": 128256, "tie_word_embeddings": false, "rope_theta": 500000.0, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-05, "hidden_act": "silu", "attention_bias": false, "mlp_bias": false,
 "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "torch_dtype": "bfloat16",
 "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
JSON
  xz -dc tests/data/reference/tokenizers/llama3/tokenizer.json.xz >"$model/tokenizer.json"
  cp tests/data/reference/tokenizers/llama3/tokenizer_config.json "$model/"
  echo "$model"
}
