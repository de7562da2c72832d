#!/usr/bin/env python3
"""Writes a tiny Qwen3 embedding checkpoint in the layout of the Qwen3-Embedding releases and its
sentence-transformers goldens.

The checkpoint: a random-weight Qwen3Model (no LM head; tensors without the `model.` prefix, as
sentence-transformers saves its Transformer module), f32, the byte-level BPE tokenizer of
models/strata-demo with a post-processor that appends <|endoftext|> (last-token pooling reads
the hidden state at that token), left padding, and the sentence-transformers modules
(Transformer -> Pooling(lasttoken) -> Normalize) with a `query` instruction prompt.

The goldens: SentenceTransformer(DIR, device="cpu").encode(...) in float32 for a few texts, with
and without the query prompt, with `truncate_dim` (re-normalized after truncation, as the
OpenAI `dimensions` field returns unit vectors), and the input ids its tokenizer produced.

Usage: qwen3_embedding.py --demo models/strata-demo --out DIR
"""
import argparse
import json
import os
import shutil

import torch
from transformers import Qwen3Config, Qwen3Model, AutoTokenizer
from sentence_transformers import SentenceTransformer

QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"

TEXTS = [
    "In the beginning God created the heaven and the earth.",
    "What is a list comprehension?",
    "a",
    "The quick brown fox jumps over the lazy dog, and then it runs away into the forest " * 4,
    "Ünïcödé text with emoji \U0001F600 and tabs\tand\nnewlines",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--demo", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out = args.out
    os.makedirs(out, exist_ok=True)

    torch.manual_seed(20261202)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=0, pad_token_id=0)
    cfg.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3Model(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)

    tok = json.load(open(os.path.join(args.demo, "tokenizer.json")))
    eot = next(t for t in tok["added_tokens"] if t["content"] == "<|endoftext|>")
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
        "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [eot["id"]],
                                             "tokens": ["<|endoftext|>"]}},
    }
    json.dump(tok, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    json.dump({"backend": "tokenizers", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "padding_side": "left", "model_max_length": 512, "tokenizer_class": "TokenizersBackend",
               "unk_token": None},
              open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)

    json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}],
              open(os.path.join(out, "modules.json"), "w"), indent=2)
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    json.dump({"word_embedding_dimension": cfg.hidden_size, "pooling_mode_cls_token": False,
               "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
               "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
               "pooling_mode_lasttoken": True, "include_prompt": True},
              open(os.path.join(out, "1_Pooling", "config.json"), "w"), indent=2)
    os.makedirs(os.path.join(out, "2_Normalize"), exist_ok=True)
    json.dump({"max_seq_length": 512, "do_lower_case": False},
              open(os.path.join(out, "sentence_bert_config.json"), "w"), indent=2)
    json.dump({"prompts": {"query": QUERY_PROMPT, "document": ""}, "default_prompt_name": None,
               "similarity_fn_name": "cosine"},
              open(os.path.join(out, "config_sentence_transformers.json"), "w"), indent=2)

    st = SentenceTransformer(out, device="cpu")
    hf_tok = AutoTokenizer.from_pretrained(out)
    cases = []
    for prompt_name in [None, "query"]:
        emb = st.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True, batch_size=8)
        prefix = QUERY_PROMPT if prompt_name == "query" else ""
        for text, e in zip(TEXTS, emb):
            ids = hf_tok(prefix + text)["input_ids"]
            cases.append({"text": text, "prompt_name": prompt_name, "input_ids": ids,
                          "embedding": [round(float(x), 7) for x in e]})
    trunc = st.encode(TEXTS[:2], convert_to_numpy=True, truncate_dim=24)
    trunc_cases = []
    for text, e in zip(TEXTS[:2], trunc):
        t = torch.tensor(e)
        t = t / t.norm()
        trunc_cases.append({"text": text, "dimensions": 24, "embedding": [round(float(x), 7) for x in t]})
    import sentence_transformers, transformers
    json.dump({"oracle": {"sentence_transformers": sentence_transformers.__version__,
                          "transformers": transformers.__version__, "torch": torch.__version__,
                          "device": "cpu", "dtype": "float32"},
               "query_prompt": QUERY_PROMPT, "cases": cases, "dimensions_cases": trunc_cases},
              open(os.path.join(out, "embedding_goldens.json"), "w"), indent=1)
    print("wrote", out, len(cases), "cases")


if __name__ == "__main__":
    main()
