// Sampling kernel (see sampling.h). One block of 1024 threads per row. The row is processed in
// passes over a workspace copy, each pass a stream of 1024-element segments (one warp per
// segment at a time, 8 float4 loads in flight per lane):
//   copy       raw logits -> NaN-cleaned row, argmax (+ raw top-n lists for logprobs, + the
//              first top-k digit when there are no edits)
//   edits      logit bias (in order), repetition, presence/frequency on the sparse ids, then
//              the grammar mask (ids it leaves out become -inf)
//   argmax     again, only when an edit changed the row
//   top-k      k-th largest processed logit by radix selection on order-preserving keys
//              (11 + 11 + 10 bits, counting histograms)
//   weights    w = exp(s - max s), s = logit / T, 0 outside the top-k set, written in place;
//              per-segment masses, a mass histogram by the top key bits, and a shared-memory
//              list of the tokens of nonzero weight while there are at most kCompact
//   compact    (when the list is complete) sort it by (weight, id), scan: top-p, min-p and
//              the draw read the prefix sums; no further pass over the row
//   top-p      the cut token in probability order by radix selection on the weight keys
//              (mass histograms of 10 + 10 + 10 bits, then the id among equal weights)
//   kept mass  when top-p or min-p removed tokens
//   draw       id order: the segment, then the element, whose running mass passes target;
//              probability order: the same radix selection as top-p
// Arithmetic on weights is the host's bit for bit (no contraction: every product and sum is an
// explicit _rn intrinsic); masses are 64-bit fixed-point integers, exact and order-free, so a
// row gives the same token on every run.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/sampling.h"

namespace strata::cuda {
namespace {

using u64 = unsigned long long;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kSeg = 1024;                      // elements per segment (a warp: 8 float4 per lane)
constexpr int kMaxSegs = kSamplingMaxVocab / kSeg;
constexpr int kMaxTop = kSamplingMaxTopLogprobs;
constexpr int kCompact = 2 * kThreads;          // candidates the compact path sorts in shared memory
constexpr uint32_t kOneBits = 0x3F800000u;      // bits of 1.0f
constexpr int kLevel1Bins = (kOneBits >> 20) + 1;
constexpr float kFixScale = 1099511627776.0f;   // 2^40: a weight in [0, 1] as fixed point
constexpr double kFixInv = 1.0 / 1099511627776.0;

struct Shared {
  u64 hist[2048];
  u64 seg[kMaxSegs];
  float top_v[kWarps][kMaxTop];
  int32_t top_id[kWarps][kMaxTop];
  u64 cand[kCompact];      // compact path: (weight key << 32 | id) or (id << 32 | weight key)
  u64 warp_tot[kWarps];
  double red_d[kWarps];
  float red_f[kWarps];
  int32_t red_i[kWarps];
  int32_t bin;
  u64 before;
  int32_t found;
  int32_t n_cand;
  int32_t pending_seen;     // the row's pending token is in its repetition list
  int32_t pending_counted;  // ... in its presence/frequency list
};

// ---- the host's arithmetic (sampling/vector_math.h, logits_processors.h), uncontracted ----

__device__ __forceinline__ float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;
  constexpr uint32_t kFloorBits = 0xC2AE0000u;  // -87.0f
  const uint32_t xb = __float_as_uint(x);
  const float xc = __uint_as_float(xb < kFloorBits ? xb : kFloorBits);
  const float t = __fadd_rn(__fmul_rn(xc, kLog2e), kRoundMagic);
  const float n = __fsub_rn(t, kRoundMagic);
  const float r = __fsub_rn(__fsub_rn(xc, __fmul_rn(n, kLn2Hi)), __fmul_rn(n, kLn2Lo));
  float p = 1.0f / 5040.0f;
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 720.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 120.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 24.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f / 6.0f);
  p = __fadd_rn(__fmul_rn(p, r), 0.5f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  p = __fadd_rn(__fmul_rn(p, r), 1.0f);
  const int32_t ni = __float_as_int(t) - __float_as_int(kRoundMagic);
  const float scale = __int_as_float((ni + 127) << 23);
  const uint32_t eb = __float_as_uint(__fmul_rn(p, scale));
  const uint32_t capped = eb < kOneBits ? eb : kOneBits;
  const uint32_t keep = xb <= kFloorBits ? 0xFFFFFFFFu : 0u;
  return __uint_as_float(capped & keep);
}

__device__ __forceinline__ float clean(float v) { return isnan(v) ? -INFINITY : v; }

// Ascending value -> ascending key, for any non-NaN float.
__device__ __forceinline__ uint32_t ordered_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
// For a weight in [0, 1]: smaller key = heavier; equal keys = equal weights.
__device__ __forceinline__ uint32_t weight_key(float w) { return kOneBits - __float_as_uint(w); }
__device__ __forceinline__ u64 fixed(float w) { return __float2ull_rn(__fmul_rn(w, kFixScale)); }

// (value descending, id ascending): argmax ties and the logprob order.
__device__ __forceinline__ bool better(float v, int32_t id, float bv, int32_t bid) {
  return v > bv || (v == bv && id < bid);
}

// ---- warp and block helpers ----

__device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
__device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }

__device__ __forceinline__ u64 warp_sum(u64 v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ u64 warp_inclusive_scan(u64 v) {
  const int lane = lane_id();
  for (int o = 1; o < 32; o <<= 1) {
    const u64 up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  return v;
}
__device__ __forceinline__ void warp_argmax(float& v, int32_t& id) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oid = __shfl_xor_sync(0xffffffffu, id, o);
    if (better(ov, oid, v, id)) {
      v = ov;
      id = oid;
    }
  }
}

// Every thread gets the block's result. The leading barrier lets the scratch be reused.
__device__ double block_sum(Shared& sh, double v) {
  v = warp_sum(v);
  __syncthreads();
  if (lane_id() == 0) sh.red_d[warp_id()] = v;
  __syncthreads();
  return warp_sum(sh.red_d[lane_id()]);
}
__device__ void block_argmax(Shared& sh, float& v, int32_t& id) {
  warp_argmax(v, id);
  __syncthreads();
  if (lane_id() == 0) {
    sh.red_f[warp_id()] = v;
    sh.red_i[warp_id()] = id;
  }
  __syncthreads();
  v = sh.red_f[lane_id()];
  id = sh.red_i[lane_id()];
  warp_argmax(v, id);
}

__device__ void zero_hist(Shared& sh, int n) {
  for (int i = threadIdx.x; i < n; i += kThreads) sh.hist[i] = 0;
  __syncthreads();
}

// Adds 1 to hist[bin] for the active lanes, one atomic per distinct bin of the warp: logits
// crowd into a few bins, and lanes hitting one address would serialize.
__device__ __forceinline__ void count_add(u64* hist, uint32_t bin, bool active) {
  const unsigned act = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(act, bin);
  if (lane_id() == __ffs(peers) - 1) atomicAdd(&hist[bin], u64(__popc(peers)));
}

// Calls f(i, w) for every element of the padded row [0, n_seg * kSeg) (f may change w when
// kWrite) and, when seg_out is given, stores the per-segment sum of what f returns.
template <bool kWrite, class F>
__device__ __forceinline__ void row_pass(float* row, int n_seg, u64* seg_out, F&& f) {
  const int lane = lane_id();
  for (int seg = warp_id(); seg < n_seg; seg += kWarps) {
    float4* p = reinterpret_cast<float4*>(row + int64_t(seg) * kSeg);
    float4 v[8];
#pragma unroll
    for (int it = 0; it < 8; ++it) v[it] = p[it * 32 + lane];
    u64 acc = 0;
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int i = seg * kSeg + it * 128 + lane * 4;
      acc += f(i, v[it].x);
      acc += f(i + 1, v[it].y);
      acc += f(i + 2, v[it].z);
      acc += f(i + 3, v[it].w);
      if (kWrite) p[it * 32 + lane] = v[it];
    }
    if (seg_out != nullptr) {
      acc = warp_sum(acc);
      if (lane == 0) seg_out[seg] = acc;
    }
  }
}

__device__ __forceinline__ bool crosses(u64 x, u64 target, bool strict) { return strict ? x > target : x >= target; }

// One warp: scans hist[0, n_bins) (descending: from the last bin down) from running total
// `before` and returns the first bin where before + its mass crosses target, with the total
// ahead of it. Exact integers make a crossing certain where the caller's target is in range;
// should none cross, the last non-empty bin is returned.
__device__ void warp_find_crossing(const u64* hist, int n_bins, bool descending, u64 before, u64 target, bool strict,
                                   int32_t* bin_out, u64* before_out) {
  const int lane = lane_id();
  const int chunk = (n_bins + 31) / 32;
  const int r0 = min(lane * chunk, n_bins), r1 = min(r0 + chunk, n_bins);
  auto bin_at = [&](int r) { return descending ? n_bins - 1 - r : r; };
  u64 sum = 0;
  for (int r = r0; r < r1; ++r) sum += hist[bin_at(r)];
  const u64 incl = warp_inclusive_scan(sum);
  const u64 excl = incl - sum;
  const unsigned mask = __ballot_sync(0xffffffffu, sum > 0 && crosses(before + incl, target, strict));
  if (mask != 0) {
    const int owner = __ffs(mask) - 1;
    if (lane == owner) {
      u64 cum = before + excl;
      for (int r = r0; r < r1; ++r) {
        const u64 h = hist[bin_at(r)];
        if (h > 0 && crosses(cum + h, target, strict)) {
          *bin_out = bin_at(r);
          *before_out = cum;
          break;
        }
        cum += h;
      }
    }
    return;
  }
  if (lane == 0) {
    u64 cum = before;
    int32_t last = bin_at(0);
    u64 before_last = before;
    for (int r = 0; r < n_bins; ++r) {
      const u64 h = hist[bin_at(r)];
      if (h == 0) continue;
      last = bin_at(r);
      before_last = cum;
      cum += h;
    }
    *bin_out = last;
    *before_out = before_last;
  }
}

// One warp: walks segment seg in id order from running total `before` and returns the first
// id where the running sum of f(i, w) crosses target (-1 if none does).
template <class F>
__device__ int32_t warp_walk_segment(const float* row, int seg, u64 before, u64 target, bool strict, F&& f) {
  const int lane = lane_id();
  const float4* p = reinterpret_cast<const float4*>(row + int64_t(seg) * kSeg);
  for (int it = 0; it < 8; ++it) {
    const float4 v = p[it * 32 + lane];
    const int i = seg * kSeg + it * 128 + lane * 4;
    const u64 a[4] = {f(i, v.x), f(i + 1, v.y), f(i + 2, v.z), f(i + 3, v.w)};
    const u64 sum = a[0] + a[1] + a[2] + a[3];
    const u64 incl = warp_inclusive_scan(sum);
    const unsigned mask = __ballot_sync(0xffffffffu, crosses(before + incl, target, strict));
    if (mask != 0) {
      const int owner = __ffs(mask) - 1;
      int32_t id = -1;
      if (lane == owner) {
        u64 cum = before + incl - sum;
        for (int c = 0; c < 4 && id < 0; ++c) {
          cum += a[c];
          if (crosses(cum, target, strict)) id = i + c;
        }
      }
      return __shfl_sync(0xffffffffu, id, owner);
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return -1;
}

// In id order over f's values whose per-segment sums are in sh.seg: the first id where the
// running sum crosses target. Every thread gets it.
template <class F>
__device__ int32_t find_in_id_order(Shared& sh, const float* row, int n_seg, u64 target, bool strict, F&& f) {
  __syncthreads();  // sh.seg complete
  if (warp_id() == 0) {
    int32_t seg = 0;
    u64 before = 0;
    warp_find_crossing(sh.seg, n_seg, false, 0, target, strict, &sh.bin, &sh.before);
    __syncwarp();
    seg = sh.bin;
    before = sh.before;
    const int32_t id = warp_walk_segment(row, seg, before, target, strict, f);
    if (lane_id() == 0) sh.found = id;
  }
  __syncthreads();
  return sh.found;
}

// The j-th (0-based, id order) element where pred(i, w) holds.
template <class P>
__device__ int32_t select_nth(Shared& sh, float* row, int n_seg, u64 j, P&& pred) {
  auto count = [&](int i, float w) -> u64 { return pred(i, w) ? 1 : 0; };
  row_pass<false>(row, n_seg, sh.seg, count);
  return find_in_id_order(sh, row, n_seg, j + 1, false, count);
}

// Warp-scan of hist[0, n_bins) for a crossing; every thread gets (bin, before).
__device__ void block_find_crossing(Shared& sh, int n_bins, bool descending, u64 before, u64 target, bool strict,
                                    int32_t* bin, u64* before_out) {
  __syncthreads();  // hist complete
  if (warp_id() == 0) warp_find_crossing(sh.hist, n_bins, descending, before, target, strict, &sh.bin, &sh.before);
  __syncthreads();
  *bin = sh.bin;
  *before_out = sh.before;
  __syncthreads();  // read before anyone overwrites hist or the scalars
}

// Probability order (weight descending, id ascending) over the tokens where pred(i, w) holds,
// with sh.hist[0, kLevel1Bins) already holding their masses by weight_key >> 20: the first
// token where the running mass crosses target (>= or > when strict). *key_out: its weight key.
template <class P>
__device__ int32_t heavier_search(Shared& sh, float* row, int n_seg, u64 target, bool strict, P&& pred,
                                  uint32_t* key_out) {
  int32_t b1, b2, b3;
  u64 before;
  block_find_crossing(sh, kLevel1Bins, false, 0, target, strict, &b1, &before);
  zero_hist(sh, 1024);
  row_pass<false>(row, n_seg, nullptr, [&](int i, float w) -> u64 {
    const u64 f = fixed(w);
    if (f > 0 && pred(i, w) && (weight_key(w) >> 20) == uint32_t(b1)) {
      atomicAdd(&sh.hist[(weight_key(w) >> 10) & 1023u], f);
    }
    return 0;
  });
  block_find_crossing(sh, 1024, false, before, target, strict, &b2, &before);
  const uint32_t prefix = (uint32_t(b1) << 10) | uint32_t(b2);
  zero_hist(sh, 1024);
  row_pass<false>(row, n_seg, nullptr, [&](int i, float w) -> u64 {
    const u64 f = fixed(w);
    if (f > 0 && pred(i, w) && (weight_key(w) >> 10) == prefix) atomicAdd(&sh.hist[weight_key(w) & 1023u], f);
    return 0;
  });
  block_find_crossing(sh, 1024, false, before, target, strict, &b3, &before);
  const uint32_t key = (prefix << 10) | uint32_t(b3);
  *key_out = key;
  // Every token of this key weighs wf: the crossing is at the j-th of them in id order.
  const u64 wf = fixed(__uint_as_float(kOneBits - key));
  const u64 need = target - before;  // > 0 for >=, >= 0 for >
  const u64 j = strict ? need / wf : (need + wf - 1) / wf - 1;
  return select_nth(sh, row, n_seg, j, [&](int i, float w) { return pred(i, w) && weight_key(w) == key; });
}

// Warp-held top-n list: lane l < top_n holds entry l, ordered by better().
__device__ __forceinline__ void list_offer(float& lv, int32_t& lid, int top_n, float v, int32_t id, bool active) {
  const float tv = __shfl_sync(0xffffffffu, lv, top_n - 1);
  const int32_t tid = __shfl_sync(0xffffffffu, lid, top_n - 1);
  unsigned cand = __ballot_sync(0xffffffffu, active && better(v, id, tv, tid));
  while (cand != 0) {
    const int src = __ffs(cand) - 1;
    cand &= cand - 1;
    const float cv = __shfl_sync(0xffffffffu, v, src);
    const int32_t cid = __shfl_sync(0xffffffffu, id, src);
    const unsigned pos_mask = __ballot_sync(0xffffffffu, lane_id() < top_n && better(cv, cid, lv, lid));
    if (pos_mask == 0) continue;
    const int pos = __ffs(pos_mask) - 1;
    const float up_v = __shfl_up_sync(0xffffffffu, lv, 1);
    const int32_t up_id = __shfl_up_sync(0xffffffffu, lid, 1);
    if (lane_id() > pos) {
      lv = up_v;
      lid = up_id;
    } else if (lane_id() == pos) {
      lv = cv;
      lid = cid;
    }
  }
}

// ---- compact path: few candidates, sorted in shared memory ----

// Ascending bitonic sort of sh.cand[0, n), n a power of two <= kCompact.
__device__ void sort_candidates(Shared& sh, int n) {
  __syncthreads();
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int t = threadIdx.x; t < n; t += kThreads) {
        const int partner = t ^ j;
        if (partner <= t) continue;
        const u64 a = sh.cand[t], c = sh.cand[partner];
        if ((a > c) == ((t & k) == 0)) {
          sh.cand[t] = c;
          sh.cand[partner] = a;
        }
      }
      __syncthreads();
    }
  }
}

__device__ __forceinline__ u64 candidate_fixed(u64 c, bool key_low) {
  const uint32_t key = key_low ? uint32_t(c) : uint32_t(c >> 32);
  return fixed(__uint_as_float(kOneBits - key));
}

// sh.hist[j] = running fixed-point mass of sh.cand[0, j] (entries from count on weigh 0).
__device__ void scan_candidates(Shared& sh, int n, int count, bool key_low) {
  const int lane = lane_id(), warp = warp_id();
  const int j0 = 2 * threadIdx.x, j1 = j0 + 1;
  const u64 f0 = j0 < count ? candidate_fixed(sh.cand[j0], key_low) : 0;
  const u64 f1 = j1 < count ? candidate_fixed(sh.cand[j1], key_low) : 0;
  const u64 v = f0 + f1;
  const u64 incl = warp_inclusive_scan(v);
  if (lane == 31) sh.warp_tot[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const u64 x = sh.warp_tot[lane];
    const u64 xi = warp_inclusive_scan(x);
    __syncwarp();
    sh.warp_tot[lane] = xi - x;
  }
  __syncthreads();
  const u64 excl = sh.warp_tot[warp] + incl - v;
  if (j0 < n) sh.hist[j0] = excl + f0;
  if (j1 < n) sh.hist[j1] = excl + f0 + f1;
  __syncthreads();
}

// The first j < count where sh.hist[j] (increasing) crosses target; count - 1 if none does.
__device__ int first_crossing(Shared& sh, int count, u64 target, bool strict) {
  if (threadIdx.x == 0) sh.found = count - 1;
  __syncthreads();
  for (int j = threadIdx.x; j < count; j += kThreads) {
    if (crosses(sh.hist[j], target, strict) && (j == 0 || !crosses(sh.hist[j - 1], target, strict))) sh.found = j;
  }
  __syncthreads();
  const int j = sh.found;
  __syncthreads();
  return j;
}

// The kept set and the draw from sh.cand[0, count): every token of the row with a nonzero
// fixed-point weight, unordered. The kept set is a prefix of the probability order, so it
// becomes a cut (key, id) for the probabilities pass.
struct CompactResult {
  int32_t token;
  bool has_cut;
  uint32_t cut_key;
  int32_t cut_id;
  u64 mass;
};
__device__ CompactResult compact_select(Shared& sh, int count, const SamplingRow& P, bool top_p, bool min_p,
                                        bool row_order, u64 total) {
  int n = 2;
  while (n < count) n <<= 1;
  for (int t = count + threadIdx.x; t < n; t += kThreads) sh.cand[t] = ~u64(0);
  sort_candidates(sh, n);
  scan_candidates(sh, n, count, false);
  int kept = count;
  if (top_p) {
    const double t = ceil(double(P.top_p) * double(total));
    u64 target = t < 1.0 ? 1 : u64(t);
    if (target > total) target = total;
    kept = first_crossing(sh, count, target, false) + 1;
  }
  if (min_p) {
    // Weights descend along the list: the kept ones are those before the first below min_p.
    const int32_t min_bits = __float_as_int(P.min_p);
    if (threadIdx.x == 0) sh.found = count;
    __syncthreads();
    for (int j = threadIdx.x; j < count; j += kThreads) {
      const auto bits = [&](int k) { return int32_t(kOneBits - uint32_t(sh.cand[k] >> 32)); };
      if (bits(j) < min_bits && (j == 0 || bits(j - 1) >= min_bits)) sh.found = j;
    }
    __syncthreads();
    kept = max(1, min(kept, sh.found));
    __syncthreads();
  }
  CompactResult r;
  r.has_cut = top_p || min_p;
  r.cut_key = uint32_t(sh.cand[kept - 1] >> 32);
  r.cut_id = int32_t(uint32_t(sh.cand[kept - 1]));
  r.mass = sh.hist[kept - 1];
  const u64 target = __umul64hi(P.draw & ~u64(0x7FF), r.mass);
  if (!row_order) {
    const int j = first_crossing(sh, kept, target, true);
    r.token = int32_t(uint32_t(sh.cand[j]));
    return r;
  }
  // Id order over the kept prefix: re-key as (id, weight key) and sort again (once every
  // thread has read the cut above).
  __syncthreads();
  for (int t = threadIdx.x; t < n; t += kThreads) {
    const u64 c = sh.cand[t];
    sh.cand[t] = t < kept ? ((c << 32) | (c >> 32)) : ~u64(0);
  }
  sort_candidates(sh, n);
  scan_candidates(sh, n, kept, true);
  const int j = first_crossing(sh, kept, target, true);
  r.token = int32_t(sh.cand[j] >> 32);
  return r;
}

__global__ void __launch_bounds__(kThreads, 1) sampling_kernel(SamplingBatch b, int32_t compact) {
  __shared__ Shared sh;
  pdl_wait();
  pdl_launch_dependents();
  const int row_index = blockIdx.x;
  const SamplingRow P = b.rows[row_index];
  const int lane = lane_id(), warp = warp_id();
  const int n = P.vocab_limit > 0 ? min(b.vocab, P.vocab_limit) : b.vocab;
  const int n_seg = (n + kSeg - 1) / kSeg;
  const int64_t stride = int64_t((b.vocab + kSeg - 1) / kSeg) * kSeg;
  float* work = static_cast<float*>(b.workspace) + int64_t(row_index) * stride;
  const float* raw = b.logits + int64_t(row_index) * b.logits_stride;
  const bool greedy = !(P.temperature > 0.0f);
  // A token of the previous step the lists miss (overlapped steps): counted with them.
  const int32_t pend = P.pending >= 0 && b.pending_tokens != nullptr ? b.pending_tokens[P.pending] : -1;
  const bool pend_on = pend >= 0 && pend < n;
  const bool rep_on = P.repetition_penalty != 1.0f && (P.seen_count > 0 || pend_on);
  const bool pf_on = (P.presence_penalty != 0.0f || P.frequency_penalty != 0.0f) && (P.counts_count > 0 || pend_on);
  const bool mask_on = P.mask >= 0 && b.masks != nullptr;
  const bool edits = P.bias_count > 0 || rep_on || pf_on || mask_on;
  const bool copy = !greedy || edits;
  const bool want_lp = P.top_logprobs >= 0 && b.chosen_logprob != nullptr;
  const int top_n = want_lp ? min(P.top_logprobs, kMaxTop) : 0;
  // Without edits the copy already holds the processed row: it also counts the first top-k
  // radix digit, saving a pass.
  const bool top_k_on = !greedy && P.top_k > 0 && P.top_k < n;
  const bool fuse_top_k = top_k_on && !edits;
  if (fuse_top_k) zero_hist(sh, 2048);

  // Copy: NaN -> -inf, padding -inf; argmax of the raw row; raw top-n per warp.
  float best_v = -INFINITY;
  int32_t best_i = INT_MAX;
  float lv = -INFINITY;
  int32_t lid = INT_MAX;
  for (int seg = warp; seg < n_seg; seg += kWarps) {
#pragma unroll 8
    for (int it = 0; it < 32; ++it) {
      const int i = seg * kSeg + it * 32 + lane;
      const float v = i < n ? clean(raw[i]) : -INFINITY;
      if (copy) work[i] = v;
      if (fuse_top_k) count_add(sh.hist, ordered_key(v) >> 21, true);
      if (better(v, i, best_v, best_i)) {
        best_v = v;
        best_i = i;
      }
      if (top_n > 0) list_offer(lv, lid, top_n, v, i, i < n);
    }
  }
  block_argmax(sh, best_v, best_i);
  const float raw_max = best_v;
  if (top_n > 0) {
    if (lane < top_n) {
      sh.top_v[warp][lane] = lv;
      sh.top_id[warp][lane] = lid;
    }
    __syncthreads();
    if (warp == 0) {
      for (int w = 1; w < kWarps; ++w) {
        const bool active = lane < top_n;
        list_offer(lv, lid, top_n, active ? sh.top_v[w][lane] : -INFINITY, active ? sh.top_id[w][lane] : INT_MAX, active);
      }
      if (lane < top_n) {
        sh.top_v[0][lane] = lv;
        sh.top_id[0][lane] = lid;
      }
    }
  }

  // Edits, in the host's order; each step sees the previous one complete.
  if (edits) {
    __syncthreads();
    if (threadIdx.x == 0) {
      sh.pending_seen = 0;
      sh.pending_counted = 0;
      for (int e = 0; e < P.bias_count; ++e) {
        const int32_t id = b.bias_ids[P.bias_begin + e];
        if (id >= 0 && id < n) work[id] = __fadd_rn(work[id], b.bias_values[P.bias_begin + e]);
      }
    }
    __syncthreads();
    // The lists hold distinct ids: one thread per id, and the pending token once more only
    // where its list lacks it (the host adds it to the list when it accepts the token).
    auto repeat = [&](int32_t id) {
      const float l = work[id];
      work[id] = l > 0.0f ? __fdiv_rn(l, P.repetition_penalty) : __fmul_rn(l, P.repetition_penalty);
    };
    if (rep_on) {
      for (int e = threadIdx.x; e < P.seen_count; e += kThreads) {
        const int32_t id = b.seen_ids[P.seen_begin + e];
        if (id < 0 || id >= n) continue;
        if (id == pend) sh.pending_seen = 1;
        repeat(id);
      }
    }
    __syncthreads();
    if (rep_on && pend_on && threadIdx.x == 0 && sh.pending_seen == 0) repeat(pend);
    __syncthreads();
    auto penalize = [&](int32_t id, int32_t count) {
      const float sub = __fadd_rn(__fmul_rn(P.frequency_penalty, float(count)), P.presence_penalty);
      work[id] = __fsub_rn(work[id], sub);
    };
    if (pf_on) {
      for (int e = threadIdx.x; e < P.counts_count; e += kThreads) {
        const int32_t id = b.count_ids[P.counts_begin + e];
        int32_t count = b.count_values[P.counts_begin + e];
        if (id < 0 || id >= n) continue;
        if (id == pend) {
          sh.pending_counted = 1;
          ++count;
        }
        if (count <= 0) continue;
        penalize(id, count);
      }
    }
    __syncthreads();
    if (pf_on && pend_on && threadIdx.x == 0 && sh.pending_counted == 0) penalize(pend, 1);
    __syncthreads();
    best_v = -INFINITY;
    best_i = INT_MAX;
    if (mask_on) {
      // The mask last, with the argmax: -inf stays -inf through every edit above, as on the host.
      const uint32_t* m = b.masks + int64_t(P.mask) * b.mask_words;
      row_pass<true>(work, n_seg, nullptr, [&](int i, float& w) -> u64 {
        if (i < n && !((m[i >> 5] >> (i & 31)) & 1u)) w = -INFINITY;
        if (better(w, i, best_v, best_i)) {
          best_v = w;
          best_i = i;
        }
        return 0;
      });
    } else {
      row_pass<false>(work, n_seg, nullptr, [&](int i, float w) -> u64 {
        if (better(w, i, best_v, best_i)) {
          best_v = w;
          best_i = i;
        }
        return 0;
      });
    }
    block_argmax(sh, best_v, best_i);
  }
  const float proc_max = best_v;
  const bool empty = !(proc_max > -INFINITY);
  int32_t token = empty ? -1 : best_i;

  bool row_order = true;      // the host's draw order: id (row mode) or probability
  bool has_cut = false;       // top-p cut (key, id) in probability order
  uint32_t cut_key = 0;
  int32_t cut_id = 0;
  int32_t min_bits = 0;       // kept: bits(w) >= min_bits
  u64 mass = 0;
  int32_t compact_token = -1;  // the draw, when the compact path made it
  if (!greedy && !empty) {
    const float T = P.temperature;
    const float top_max = __fdiv_rn(proc_max, T);
    if (isinf(top_max)) {
      // The softmax limit: equal mass on the tokens tied at the maximum (the host's rule).
      row_pass<true>(work, n_seg, sh.seg, [&](int i, float& w) -> u64 {
        w = (i < n && w == proc_max) ? 1.0f : 0.0f;
        return fixed(w);
      });
    } else {
      const bool top_k = top_k_on;
      const bool top_p = P.top_p < 1.0f;
      const bool min_p = P.min_p > 0.0f;
      row_order = !top_k && (top_p || !min_p);
      float gate = -INFINITY;
      if (top_k) {
        // The k-th largest processed logit; dividing by T is monotone, so the k-th largest
        // scaled logit is its quotient.
        uint32_t prefix = 0;
        u64 k_left = u64(P.top_k);
        const int shifts[3] = {21, 10, 0};
        const int widths[3] = {11, 11, 10};
        for (int d = 0; d < 3; ++d) {
          const int shift = shifts[d], width = widths[d];
          const uint32_t mask = (1u << width) - 1;
          if (d > 0 || !fuse_top_k) {
            zero_hist(sh, 1 << width);
            row_pass<false>(work, n_seg, nullptr, [&](int, float w) -> u64 {
              const uint32_t key = ordered_key(w);
              const bool match = d == 0 || (key >> (shift + width)) == prefix;
              count_add(sh.hist, (key >> shift) & mask, match);
              return 0;
            });
          }
          int32_t bin;
          u64 above;
          block_find_crossing(sh, 1 << width, true, 0, k_left, false, &bin, &above);
          k_left -= above;
          prefix = (prefix << width) | uint32_t(bin);
        }
        gate = __fdiv_rn(from_ordered_key(prefix), T);
      }
      const bool want_hist = top_p || !row_order;
      if (want_hist) zero_hist(sh, kLevel1Bins);
      if (threadIdx.x == 0) sh.n_cand = 0;
      __syncthreads();
      const bool gather = compact != 0;
      row_pass<true>(work, n_seg, sh.seg, [&](int i, float& w) -> u64 {
        const float s = __fdiv_rn(w, T);
        w = (i < n && s >= gate) ? exp_nonpositive(__fsub_rn(s, top_max)) : 0.0f;
        const u64 f = fixed(w);
        if (want_hist && f > 0) atomicAdd(&sh.hist[weight_key(w) >> 20], f);
        if (gather) {
          // Candidates for the compact path until there are too many (then n_cand > kCompact).
          const unsigned take = __ballot_sync(0xffffffffu, f > 0);
          if (take != 0) {
            int base = 0;
            if (lane == 0) {
              base = *reinterpret_cast<volatile int32_t*>(&sh.n_cand);
              if (base <= kCompact) base = atomicAdd(&sh.n_cand, __popc(take));
            }
            base = __shfl_sync(0xffffffffu, base, 0);
            const int slot = base + __popc(take & ((1u << lane) - 1));
            if (f > 0 && slot < kCompact) sh.cand[slot] = (u64(weight_key(w)) << 32) | uint32_t(i);
          }
        }
        return f;
      });
      __syncthreads();
      u64 total = 0;
      for (int s = lane; s < n_seg; s += 32) total += sh.seg[s];
      total = warp_sum(total);
      const int n_cand = sh.n_cand;
      if (gather && n_cand > 0 && n_cand <= kCompact) {
        const CompactResult r = compact_select(sh, n_cand, P, top_p, min_p, row_order, total);
        compact_token = r.token;
        has_cut = r.has_cut;
        cut_key = r.cut_key;
        cut_id = r.cut_id;
        mass = r.mass;
      } else if (top_p) {
        double t = ceil(double(P.top_p) * double(total));
        u64 target = t < 1.0 ? 1 : u64(t);
        if (target > total) target = total;
        cut_id = heavier_search(sh, work, n_seg, target, false, [&](int, float) { return true; }, &cut_key);
        has_cut = true;
      }
      if (min_p) min_bits = __float_as_int(P.min_p);
      if (compact_token < 0 && !has_cut && !min_p) mass = total;
    }
    auto kept = [&](int i, float w) {
      if (i >= n || __float_as_int(w) < min_bits) return false;
      if (!has_cut) return true;
      const uint32_t k = weight_key(w);
      return k < cut_key || (k == cut_key && i <= cut_id);
    };
    auto kept_fixed = [&](int i, float w) -> u64 { return kept(i, w) ? fixed(w) : 0; };
    if (mass == 0) {
      if (has_cut || min_bits > 0) {
        if (!row_order) zero_hist(sh, kLevel1Bins);
        row_pass<false>(work, n_seg, sh.seg, [&](int i, float w) -> u64 {
          const u64 f = kept_fixed(i, w);
          if (!row_order && f > 0) atomicAdd(&sh.hist[weight_key(w) >> 20], f);
          return f;
        });
      }
      __syncthreads();
      u64 m = 0;
      for (int s = lane; s < n_seg; s += 32) m += sh.seg[s];
      mass = warp_sum(m);
    }
    // u = (draw >> 11) * 2^-53 (the host's next_double); target = floor(u * mass).
    const u64 target = __umul64hi(P.draw & ~u64(0x7FF), mass);
    int32_t drawn;
    if (compact_token >= 0) {
      drawn = compact_token;
    } else if (row_order) {
      drawn = find_in_id_order(sh, work, n_seg, target, true, kept_fixed);
    } else {
      uint32_t key;
      drawn = heavier_search(sh, work, n_seg, target, true, kept, &key);
    }
    if (drawn >= 0) token = drawn;
    if (b.probs != nullptr) {
      __syncthreads();
      float* out = b.probs + int64_t(row_index) * b.vocab;
      const double inv_mass = 1.0 / (double(mass) * kFixInv);
      const int vocab_segs = (b.vocab + kSeg - 1) / kSeg;  // the row is padded that far
      row_pass<false>(work, vocab_segs, nullptr, [&](int i, float w) -> u64 {
        if (i < b.vocab) out[i] = kept(i, w) ? float(double(w) * inv_mass) : 0.0f;
        return 0;
      });
    }
  } else if (b.probs != nullptr) {
    float* out = b.probs + int64_t(row_index) * b.vocab;
    for (int i = threadIdx.x; i < b.vocab; i += kThreads) out[i] = i == token ? 1.0f : 0.0f;
  }
  if (threadIdx.x == 0) b.tokens[row_index] = token;

  if (!want_lp) return;
  // Logprobs of the raw row: log-sum-exp, then the chosen token and the top list.
  double sum = 0.0;
  for (int i = threadIdx.x; i < n; i += kThreads) sum += exp_nonpositive(__fsub_rn(clean(raw[i]), raw_max));
  sum = block_sum(sh, sum);
  if (threadIdx.x == 0) {
    const double log_total = log(sum);
    auto to_logprob = [&](float l) { return float((double(l) - double(raw_max)) - log_total); };
    b.chosen_logprob[row_index] = token >= 0 ? to_logprob(clean(raw[token])) : -INFINITY;
    float v[kMaxTop];
    int32_t id[kMaxTop];
    for (int j = 0; j < top_n; ++j) {
      v[j] = to_logprob(sh.top_v[0][j]);
      id[j] = sh.top_id[0][j];
    }
    // Two logits can round to one logprob: restore the (logprob, id) order.
    for (int j = 1; j < top_n; ++j) {
      for (int k = j; k > 0 && better(v[k], id[k], v[k - 1], id[k - 1]); --k) {
        const float tv = v[k];
        v[k] = v[k - 1];
        v[k - 1] = tv;
        const int32_t ti = id[k];
        id[k] = id[k - 1];
        id[k - 1] = ti;
      }
    }
    int32_t* ids_out = b.top_ids + int64_t(row_index) * kMaxTop;
    float* lp_out = b.top_logprob + int64_t(row_index) * kMaxTop;
    for (int j = 0; j < kMaxTop; ++j) {
      const bool real = j < top_n && id[j] < n;  // fewer tokens than top_n: sentinels stay out
      ids_out[j] = real ? id[j] : -1;
      lp_out[j] = real ? v[j] : -INFINITY;
    }
  }
}

}  // namespace

namespace {
bool g_compact = true;
}  // namespace

void set_sampling_compact(bool on) { g_compact = on; }

size_t sampling_workspace_bytes(int32_t max_rows, int32_t vocab) {
  const int64_t stride = (int64_t(vocab) + kSeg - 1) / kSeg * kSeg;
  return size_t(max_rows) * size_t(stride) * sizeof(float);
}

void launch_sampling(const SamplingBatch& batch, cudaStream_t stream) {
  if (batch.n_rows <= 0) return;
  launch_pdl(sampling_kernel, dim3(batch.n_rows), dim3(kThreads), 0, stream, batch, int32_t(g_compact ? 1 : 0));
}

}  // namespace strata::cuda
