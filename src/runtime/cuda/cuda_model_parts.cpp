#include "runtime/cuda/cuda_model_parts.h"

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "runtime/cuda/cuda_family.h"
#include "tensor/dtype.h"

namespace strata::cuda::model_parts {

Dims dims_of(const ModelConfig& c) {
  Dims d{};
  d.H = c.hidden;
  d.V = c.vocab_size;
  d.nh = c.n_heads;
  d.nkv = c.n_kv_heads;
  d.hd = c.head_dim;
  d.I = c.intermediate;
  d.L = c.n_layers;
  d.qkv_rows = (d.nh + 2 * d.nkv) * d.hd;
  d.n_sparse = 0;
  for (int64_t l = 0; l < d.L; ++l) d.n_sparse += layer_sparse(c, l) ? 1 : 0;
  d.E = d.n_sparse > 0 ? c.n_experts : 0;
  d.top_k = d.n_sparse > 0 ? c.n_experts_per_tok : 0;
  d.mI = d.n_sparse > 0 ? c.moe_intermediate : 0;
  return d;
}

// Bytes the arena needs: weights (bf16 matrices, f32 vectors) and step scratch.
size_t arena_bytes(const Dims& d, const CudaModelOptions& o, bool tied, int n_rope_types) {
  size_t b = 0;
  auto add = [&](size_t bytes) { b += align256(bytes); };
  add(2 * d.V * d.H);
  if (!tied) add(2 * d.V * d.H);
  add(4 * d.H);
  for (int i = 0; i < n_rope_types; ++i) add(4 * d.hd);
  // A layer matrix [rows, cols]; with random FP8, as the sink stores it when its parts stack whole
  // 128-row blocks (stacks: the rows of the parts before the last).
  auto matrix = [&](int64_t rows, int64_t cols, std::initializer_list<int64_t> stacks) {
    bool fp8 = o.random_fp8 && cols % 16 == 0;
    for (const int64_t s : stacks) fp8 = fp8 && s % 128 == 0;
    if (!fp8) {
      add(size_t(2 * rows * cols));
      return;
    }
    add(size_t(rows * cols));
    add(size_t(4 * ((rows + 127) / 128) * ((cols + 127) / 128)));
  };
  for (int64_t l = 0; l < d.L; ++l) {
    matrix(d.qkv_rows, d.H, {d.nh * d.hd, d.nkv * d.hd});
    matrix(d.H, d.nh * d.hd, {});
    if (l < d.L - d.n_sparse) {  // as many dense layers as there are (which ones does not matter)
      matrix(2 * d.I, d.H, {d.I});
      matrix(d.H, d.I, {});
    } else {
      add(2 * d.E * d.H);
      add(2 * d.E * 2 * d.mI * d.H);
      add(2 * d.E * d.H * d.mI);
    }
    add(4 * d.H);
    add(4 * d.H);
    add(4 * d.H);  // sandwich norms
    add(4 * d.H);
    add(4 * d.qkv_rows);
    add(4 * d.H);
    add(4 * d.hd);
    add(4 * d.hd);
  }
  const size_t T = size_t(o.max_tokens), R = size_t(o.max_logit_rows), S = size_t(o.max_seqs);
  add(4 * T * d.H);
  add(2 * T * d.H);
  add(4 * T * d.qkv_rows);
  add(2 * T * d.nh * d.hd);
  add(2 * T * d.nh * d.hd);
  add(4 * T * d.H);
  add(2 * T * 2 * d.I);
  add(2 * T * d.I);
  add(2 * R * d.H);
  add(4 * R * d.V);
  add(4 * R);
  add(4 * kMaxSplits * S * d.nh * d.hd);
  add(4 * kMaxSplits * S * d.nh * 2);
  add(4 * kGemvMaxRows);
  add(4 * kGemvMaxRows * size_t(gemv_blocks(d.H)));
  add(4 * S * d.nkv);
  if (d.n_sparse > 0) {
    const size_t K = T * size_t(d.top_k);
    add(4 * T * d.E);
    add(4 * K);
    add(4 * K);
    add(4 * (d.E + 1));
    add(4 * K);
    add(4 * K);
    add(2 * K * 2 * d.mI);
    add(2 * K * d.mI);
    add(4 * K * d.H);
  }
  add(kGemmWorkspace);
  add(1 << 20);  // step metadata (sized exactly in init_common; checked there)
  if (o.kv_window_paging) add(4 * S * size_t(o.max_blocks_per_seq) + 8 * T + 32);  // the window tables and slots
  return b;
}

// Takes arena pieces for the step scratch and metadata.
Status take_scratch(DeviceArena& arena, const Dims& d, const CudaModelOptions& o, CudaDecoder::Buffers* b, void** workspace) {
  const int64_t T = o.max_tokens, R = o.max_logit_rows, S = o.max_seqs;
#define TAKE(field, type, n)                                        \
  do {                                                              \
    auto r_ = arena.take_array<type>(size_t(n), #field);            \
    if (!r_.ok()) return r_.error();                                \
    b->field = *r_;                                                 \
  } while (0)
  TAKE(x, float, T * d.H);
  TAKE(h, uint16_t, T * d.H);
  TAKE(qkv, float, T * d.qkv_rows);
  TAKE(q, uint16_t, T * d.nh * d.hd);
  TAKE(attn, uint16_t, T * d.nh * d.hd);
  TAKE(branch, float, T * d.H);
  TAKE(gate_up, uint16_t, T * 2 * d.I);
  TAKE(act, uint16_t, T * d.I);
  TAKE(rows_h, uint16_t, R * d.H);
  TAKE(logits, float, R * d.V);
  TAKE(argmax, int32_t, R);
  TAKE(partial_out, float, int64_t(kMaxSplits) * S * d.nh * d.hd);
  TAKE(partial_ml, float, int64_t(kMaxSplits) * S * d.nh * 2);
  TAKE(ss_embed, float, kGemvMaxRows);
  TAKE(ss_parts, float, kGemvMaxRows * gemv_blocks(d.H));
  TAKE(split_counters, int32_t, S * d.nkv);
  if (d.n_sparse > 0) {
    const int64_t K = T * d.top_k;
    TAKE(moe_logits, float, T * d.E);
    TAKE(moe_ids, int32_t, K);
    TAKE(moe_w, float, K);
    TAKE(moe_offsets, int32_t, d.E + 1);
    TAKE(moe_sorted, int32_t, K);
    TAKE(moe_slot_row, int32_t, K);
    TAKE(moe_gate_up, uint16_t, K * 2 * d.mI);
    TAKE(moe_act, uint16_t, K * d.mI);
    TAKE(moe_y, float, K * d.H);
  }
#undef TAKE
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(b->split_counters, 0, size_t(S * d.nkv) * sizeof(int32_t)));
  auto ws = arena.take(kGemmWorkspace, "GEMM workspace");
  if (!ws.ok()) return ws.error();
  *workspace = *ws;

  size_t off = 0;
  auto place = [&](size_t bytes) {
    const size_t at = off;
    off = (off + bytes + 15) & ~size_t(15);
    return at;
  };
  b->off_tokens = place(4 * T);
  b->off_positions = place(4 * T);
  b->off_slots = place(8 * T);
  b->off_tables = place(4 * S * o.max_blocks_per_seq);
  b->off_q_start = place(4 * (S + 1));
  b->off_pos0 = place(4 * S);
  b->off_tile_seq = place(4 * (T + S));
  b->off_tile_q0 = place(4 * (T + S));
  b->off_row_map = place(4 * R);
  const bool window = o.kv_window_paging;
  b->off_window_tables = place(window ? 4 * S * o.max_blocks_per_seq : 0);
  b->off_window_slots = place(window ? 8 * T : 0);
  b->off_quant = place(o.kv_quant_start > 0 ? 4 * S : 0);
  b->meta_bytes = off;
  auto md = arena.take(off, "step metadata");
  if (!md.ok()) return md.error();
  b->meta_dev = static_cast<char*>(*md);
  void* mh = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaMallocHost(&mh, off));
  b->meta_host = static_cast<char*>(mh);
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&b->meta_copied, cudaEventDisableTiming));
  return Status();
}

// Distinct layer types in order, and each layer's index into them.
std::vector<std::string> rope_types(const ModelConfig& cfg, std::vector<int32_t>* index) {
  std::vector<std::string> types;
  index->clear();
  for (int l = 0; l < cfg.n_layers; ++l) {
    const std::string t = cfg.layer_types.empty() ? std::string("full_attention") : cfg.layer_types[size_t(l)];
    auto it = std::find(types.begin(), types.end(), t);
    if (it == types.end()) {
      types.push_back(t);
      it = types.end() - 1;
    }
    index->push_back(int32_t(it - types.begin()));
  }
  return types;
}

Result<uint16_t*> upload_bf16(DeviceArena& arena, const std::vector<float>& v, const std::string& what) {
  std::vector<bf16_t> tmp(v.size());
  for (size_t i = 0; i < v.size(); ++i) tmp[i] = f32_to_bf16(v[i]);
  auto p = arena.take_array<uint16_t>(v.size(), what);
  if (!p.ok()) return p.error();
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(*p, tmp.data(), tmp.size() * 2, cudaMemcpyHostToDevice));
  return *p;
}

Result<float*> upload_f32(DeviceArena& arena, const std::vector<float>& v, const std::string& what) {
  auto p = arena.take_array<float>(v.size(), what);
  if (!p.ok()) return p.error();
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(*p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return *p;
}

}  // namespace strata::cuda::model_parts
