// StepExecutor: what the engine needs from the thing that runs a StepPlan, wherever the weights
// and the KV pool live (host: ModelRunner; a GPU: runtime/cuda/cuda_executor.h). The engine
// plans with exactly n_kv_blocks() blocks, reads per logit row either host logits or the
// executor's greedy token, and moves KV blocks and recurrent state through host bytes (KV
// tiers, checkpoints, prefix snapshots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <vector>

#include "runtime/step_plan.h"
#include "sampling/sampler.h"

namespace strata {

// Logit rows of one step, in plan order (per span: every position with logits_all, else its
// last one with sample, else none).
struct StepRows {
  const float* logits = nullptr;    // host rows [n_host_rows, vocab] f32
  std::vector<int32_t> host_row;    // [n_rows]: index of the row in `logits`, or -1 when only
                                    // the greedy token is on the host
  std::vector<int32_t> argmax;      // [n_rows] greedy token (lowest id on ties), or empty when
                                    // the executor hands every row as logits
  std::vector<int32_t> sampled;     // [n_rows] token the executor sampled for a row the engine
                                    // handed it (RowSample), kNotSampled elsewhere; -1: every
                                    // logit of the row was -inf or NaN
  static constexpr int32_t kNotSampled = -2;
  // Raw logprobs (sampling/logprobs.h) of the rows handed as RowSamples with top_logprobs >= 0
  // (device_logprobs()); empty, or sized for the step's rows:
  std::vector<int32_t> top_n;         // [n_rows] entries in the top list; -1: the row has none
  std::vector<float> chosen_logprob;  // [n_rows] of the row's token (sampled or argmax)
  std::vector<int32_t> top_ids;       // [n_rows, kMaxTopLogprobs] logprob descending, then id
  std::vector<float> top_logprobs;    //   ascending; ids past the row's vocabulary are -1

  // Row r's logprobs as Sampler::logprobs gives them, for its token; false: none on the device.
  bool logprobs(size_t r, int32_t token, TokenLogprobs* out) const {
    if (r >= top_n.size() || top_n[r] < 0) return false;
    out->chosen = {token, chosen_logprob[r]};
    out->top.clear();
    for (int32_t j = 0; j < top_n[r]; ++j) {
      const size_t k = r * size_t(kMaxTopLogprobs) + size_t(j);
      if (top_ids[k] < 0) break;  // a vocabulary smaller than top_logprobs
      out->top.push_back({top_ids[k], top_logprobs[k]});
    }
    return true;
  }
};

// A logit row the executor samples itself (device_sampling()): the request's sampler, read for
// its parameters and penalty history, and the 64-bit draw the engine took from the sampler's
// RNG for this token (Sampler::next_draw(), exactly the one draw sample() would consume).
struct RowSample {
  const Sampler* sampler = nullptr;  // null: the row is not sampled by the executor
  uint64_t draw = 0;
  // -1: no logprobs; 0..kMaxTopLogprobs: the row's raw logprobs come back in StepRows (the
  // chosen token's and that many alternatives'); only when device_logprobs().
  int32_t top_logprobs = -1;
  // Constrained decoding (device_masks()): the ids the row may take, as the host Sampler's
  // TokenMask (after bias and penalties, before temperature and the filters). words null: no
  // mask. The words are read while run() or enqueue() runs; a step enqueue()d with
  // masks_later reads the masks handed to sample_enqueued() instead.
  TokenMask mask;
  bool mask_later = false;  // the row's mask comes with sample_enqueued() (masks_later)
};

// A decode span whose input token the previous queued step produces on the device (overlapped
// steps): the executor copies that step's token of row prev_row (its argmax, or its sampled
// token for a RowSample row) into the span's input, on the device, before the step runs.
struct TokenFeed {
  int32_t span = 0;      // index in StepPlan::spans of a one-token span
  int32_t prev_row = 0;  // logit row of the previous enqueue()d step
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;

  // Runs the plan. want_logits [n_rows]: rows whose f32 logits the engine reads on the host;
  // the others may come back as the greedy token only. samples: empty, or [n_rows] with the
  // rows the executor samples itself (only when device_sampling(); those rows have
  // want_logits 0). Valid until the next run(). Throws std::exception on a failed step (the
  // engine ends the step's requests).
  virtual const StepRows& run(const StepPlan& plan, const std::vector<uint8_t>& want_logits,
                              std::span<const RowSample> samples) = 0;
  // Floats per logit row: the vocabulary, or a pooling model's hidden size (output_width()).
  virtual int32_t vocab() const = 0;
  // Blocks of the full-attention KV pool the block ids index.
  virtual int32_t n_kv_blocks() const = 0;
  // Blocks of the sliding-window layers' pool when the executor holds one (the engine then plans
  // its window pool with exactly these); 0: it does not say (the engine's own rule).
  virtual int32_t n_kv_window_blocks() const { return 0; }
  // --kv-quant-start on the executor: blocks of its second KV pool, the one in the codecs
  // (0: none; the engine then converts only with the host ModelRunner). SeqSpan::block_table
  // entries [0, n_quant_blocks) are ids there.
  virtual int32_t n_kv_quant_blocks() const { return 0; }
  // Re-encodes exact-pool blocks src[i] into codec-pool blocks dst[i] (every layer that owns
  // full-attention KV) ahead of any later step.
  virtual void convert_kv_blocks(std::span<const int32_t> /*src*/, std::span<const int32_t> /*dst*/) {
    throw std::logic_error("this executor keeps no codec pool (n_kv_quant_blocks() is 0)");
  }
  // True when rows left out of want_logits come back as greedy tokens (no logits transfer).
  virtual bool device_argmax() const = 0;
  // True when a span may carry drafted tokens (ScheduledSpan::n_draft > 0) and comes back with
  // host logits for every position (the speculative method's verify). A batch-invariant
  // executor (the host runner; a GPU under --deterministic) computes at each position the bits
  // a one-token decode there computes, so speculation changes no output; a GPU in its default
  // mode rounds a verify as a step of its shape, as every one of its steps already depends on
  // the batch around it. The engine refuses speculation on an executor without it.
  virtual bool verifies_drafts() const { return false; }
  // Logit rows one step may ask for at most (a verify asks for k + 1); the engine drafts
  // within it.
  virtual int64_t max_logit_rows() const { return std::numeric_limits<int64_t>::max(); }
  // True when run() samples the rows handed to it as RowSamples (no logits transfer for them).
  virtual bool device_sampling() const { return false; }
  // True when RowSamples may ask for logprobs (RowSample::top_logprobs): the executor computes
  // them with the token and hands them back in StepRows (no logits transfer for those rows).
  // Implies device_sampling().
  virtual bool device_logprobs() const { return false; }
  // True when enqueue() takes RowSamples whose samplers have penalties (repetition, presence,
  // frequency): a fed row's previous token, which its sampler has not accept()ed yet when the
  // step is queued, joins the row's penalty history on the device, so the tokens are those of
  // one step at a time. Implies supports_overlap() and device_sampling().
  virtual bool device_penalties() const { return false; }
  // True when RowSamples may carry a grammar mask (RowSample::mask) and enqueue() may defer a
  // step's sampling until its masks are known (masks_later). Implies device_sampling().
  virtual bool device_masks() const { return false; }

  // Overlapped steps (supports_overlap()): enqueue() queues a step and returns without waiting
  // for the device; collect() waits for the oldest queued step and hands its rows (argmax and
  // sampled tokens and device logprobs, no host logits; valid until the next collect() or run()). At most two
  // steps are queued; run() is called only with none queued. Every row of an enqueued step has
  // want_logits 0 and is answered by the device (argmax or a RowSample); `feed` names the spans
  // whose input token the previous enqueued step produces (their token in seq->tokens is a
  // placeholder the executor may read but must not use). Both throw std::exception on a
  // failed step.
  //
  // masks_later (device_masks()): enqueue() queues the step's forward only; the rows whose
  // RowSample has mask_later are sampled under masks the engine computes from the previous
  // step's tokens, which it collects meanwhile. sample_enqueued(masks) ([n_rows], words null
  // where a row has none) then queues the step's sampling and token copies, before the next
  // enqueue() or collect(); the device runs the forward while the host computes the masks.
  virtual bool supports_overlap() const { return false; }
  virtual void enqueue(const StepPlan& /*plan*/, const std::vector<uint8_t>& /*want_logits*/,
                       std::span<const RowSample> /*samples*/, std::span<const TokenFeed> /*feed*/,
                       bool /*masks_later*/) {
    throw std::logic_error("this executor runs steps one at a time (run())");
  }
  virtual void sample_enqueued(std::span<const TokenMask> /*masks*/) {
    throw std::logic_error("this executor takes no grammar masks (device_masks())");
  }
  virtual const StepRows& collect() { throw std::logic_error("this executor runs steps one at a time (run())"); }

  // Floats of one slot's recurrent state over every layer (0: no recurrent state).
  virtual int64_t state_floats() const = 0;
  virtual void save_state(int32_t slot, float* dst /*[state_floats()]*/) = 0;
  virtual void load_state(int32_t slot, const float* src /*[state_floats()]*/) = 0;

  // One full-attention KV block over every layer that owns full-attention KV as flat bytes:
  // per layer the K rows then the V rows, [block_size, n_kv_heads] rows each in the layer's
  // row format. block_tensor_bytes() lists the bytes of each of those tensors in order.
  virtual std::vector<int64_t> block_tensor_bytes() const = 0;
  virtual void read_block(int32_t block, uint8_t* out) = 0;
  virtual void write_block(int32_t block, const uint8_t* in) = 0;

  // Blocks of the sliding-window pool (n_kv_window_blocks()) as flat bytes, laid out as
  // read_block's over the layers whose KV pages there; empty: the executor keeps no window
  // pool. Block i of a call at i * (sum of window_block_tensor_bytes()).
  virtual std::vector<int64_t> window_block_tensor_bytes() const { return {}; }
  virtual void read_window_blocks(std::span<const int32_t> /*blocks*/, uint8_t* /*out*/) {
    throw std::logic_error("this executor keeps no sliding-window pool");
  }
  virtual void write_window_blocks(std::span<const int32_t> /*blocks*/, const uint8_t* /*in*/) {
    throw std::logic_error("this executor keeps no sliding-window pool");
  }

  // Many blocks at once, block i's bytes at i * (sum of block_tensor_bytes()) in the same
  // layout as read_block / write_block. Executors whose per-block copy has a fixed cost (a
  // device pool) move the whole list in a few large transfers; by default one block at a time.
  virtual void read_blocks(std::span<const int32_t> blocks, uint8_t* out) {
    const size_t bb = block_bytes_total();
    for (size_t i = 0; i < blocks.size(); ++i) read_block(blocks[i], out + i * bb);
  }
  virtual void write_blocks(std::span<const int32_t> blocks, const uint8_t* in) {
    const size_t bb = block_bytes_total();
    for (size_t i = 0; i < blocks.size(); ++i) write_block(blocks[i], in + i * bb);
  }
  // The same with each block's bytes in a place of its own (block i at outs[i] / ins[i]): the
  // KV tiers' host slots, copied straight into and out of. A device copies directly between
  // its pool and memory given to register_host_memory(), and through staging otherwise.
  virtual void read_blocks_to(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
    for (size_t i = 0; i < blocks.size(); ++i) read_block(blocks[i], outs[i]);
  }
  virtual void write_blocks_from(std::span<const int32_t> blocks, std::span<const uint8_t* const> ins) {
    for (size_t i = 0; i < blocks.size(); ++i) write_block(blocks[i], ins[i]);
  }
  // read_blocks_to() that may return before the bytes have landed (a device copies them
  // behind the caller while it goes on, e.g. installing into the same pool blocks, which then
  // wait for the copies' reads of the pool only): a ticket for reads_landed(), 0 when they have
  // landed already (the default copies at once). The places stay untouched until they land.
  virtual uint64_t read_blocks_to_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
    read_blocks_to(blocks, outs);
    return 0;
  }
  // The same for blocks the caller holds until the ticket lands (a reference on each: no step
  // writes them meanwhile), so later steps need not wait on the device for the reads at all.
  virtual uint64_t read_held_blocks_to_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
    return read_blocks_to_async(blocks, outs);
  }
  // Whether the copies of `ticket` (and every earlier one) have landed; wait: until they have.
  // Throws std::exception when a copy failed (its places hold no valid bytes).
  virtual bool reads_landed(uint64_t /*ticket*/, bool /*wait*/) { return true; }
  // Host memory that read_blocks_to / write_blocks_from will use often (a device pins it for
  // direct copies). True when registered; unregister before the memory goes away.
  virtual bool register_host_memory(void* /*p*/, size_t /*bytes*/) { return false; }
  virtual void unregister_host_memory(void* /*p*/) {}

 private:
  size_t block_bytes_total() const {
    size_t n = 0;
    for (int64_t b : block_tensor_bytes()) n += size_t(b);
    return n;
  }
};

}  // namespace strata
