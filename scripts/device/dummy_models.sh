#!/usr/bin/env bash
# Sourced by the device scripts: make_qwen3moe_dummy prints a fresh directory holding a
# Qwen3-30B-A3B-shaped config.json (48 layers, hidden 2048, 128 experts, top 8,
# moe_intermediate 768, 32/4 heads) and the qwen3 tokenizer from tests/data/reference, for
# `strata serve --load-format dummy`; make_qwen35moe_dummy the same for a Qwen3.5-35B-A3B-shaped
# DeltaNet hybrid (40 layers, every fourth full attention, hidden 2048, 256 experts, top 8,
# moe_intermediate 512, shared expert 512, 16/2 heads of 256, DeltaNet 16 key / 32 value heads of
# 128); make_gemma3_4b_dummy a Gemma-3-4B-shaped sliding-window model (34 layers, 5 sliding : 1
# full, window 1024, hidden 2560, FFN 10240, 8/4 heads of 256) with the gemma3 tokenizer. Run from
# the repository root.
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

make_qwen35moe_dummy() {
  local model
  model=$(mktemp -d /tmp/qwen35moe-dummy-XXXXXX)
  cat >"$model/config.json" <<'JSON'
{"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "hidden_size": 2048,
 "num_hidden_layers": 40, "full_attention_interval": 4, "num_attention_heads": 16, "num_key_value_heads": 2,
 "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
 "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 256, "num_experts_per_tok": 8,
 "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "intermediate_size": 512,
 "vocab_size": 248320, "tie_word_embeddings": false, "partial_rotary_factor": 0.25,
 "rope_parameters": {"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
 "max_position_embeddings": 262144, "rms_norm_eps": 1e-06, "hidden_act": "silu", "attention_bias": false,
 "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16"}
JSON
  xz -dc tests/data/reference/tokenizers/qwen3/tokenizer.json.xz >"$model/tokenizer.json"
  cp tests/data/reference/tokenizers/qwen3/tokenizer_config.json "$model/"
  echo "$model"
}

make_gemma3_4b_dummy() {
  local model
  model=$(mktemp -d /tmp/gemma3-4b-dummy-XXXXXX)
  python3 - "$model/config.json" <<'PY'
import json, sys
types = ["full_attention" if l % 6 == 5 else "sliding_attention" for l in range(34)]
cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 2560,
       "intermediate_size": 10240, "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
       "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 1024, "layer_types": types,
       "vocab_size": 262208, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
       "max_position_embeddings": 131072, "rms_norm_eps": 1e-06, "attention_bias": False,
       "final_logit_softcapping": None, "attn_logit_softcapping": None,
       "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                           "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}},
       "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "bfloat16"}
json.dump(cfg, open(sys.argv[1], "w"), indent=1)
PY
  xz -dc tests/data/reference/tokenizers/gemma3/tokenizer.json.xz >"$model/tokenizer.json"
  cp tests/data/reference/tokenizers/gemma3/tokenizer_config.json "$model/"
  echo "$model"
}
