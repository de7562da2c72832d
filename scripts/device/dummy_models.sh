#!/usr/bin/env bash
# Sourced by the device scripts: make_qwen3moe_dummy prints a fresh directory holding a
# Qwen3-30B-A3B-shaped config.json (48 layers, hidden 2048, 128 experts, top 8,
# moe_intermediate 768, 32/4 heads) and the qwen3 tokenizer from tests/data/reference, for
# `strata serve --load-format dummy`. Run from the repository root.
make_qwen3moe_dummy() {
  local model
  model=$(mktemp -d /tmp/qwen3moe-dummy-XXXXXX)
  cat >"$model/config.json" <<'JSON'
{"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
 "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
 "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true, "decoder_sparse_step": 1,
 "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": false, "rope_theta": 1000000.0,
 "max_position_embeddings": 40960, "rms_norm_eps": 1e-06, "hidden_act": "silu", "attention_bias": false,
 "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"}
JSON
  xz -dc tests/data/reference/tokenizers/qwen3/tokenizer.json.xz >"$model/tokenizer.json"
  cp tests/data/reference/tokenizers/qwen3/tokenizer_config.json "$model/"
  echo "$model"
}
