#include "engine/engine.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <unordered_map>

#include "core/check.h"
#include "core/log.h"
#include "engine/checkpoint.h"
#include "engine/engine_core.h"
#include "engine/kv_conversion.h"
#include "engine/kv_tier_io.h"
#include "engine/kv_tier_promoter.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "kv/prefix_index.h"
#include "runtime/host/model_runner.h"

namespace strata {

namespace {

// Host staging for the blocks of checkpoints on their way to the disk tier (page-locked for a
// device): what the disk writer has not written yet waits here.
constexpr int64_t kCheckpointStagingBytes = int64_t(256) << 20;

std::string namespace_identity(const Model& model, const EngineOptions& o) {
  const ModelConfig& c = model.config();
  return "model=" + o.model_identity + ";type=" + c.model_type + ";layers=" + std::to_string(c.n_layers) +
         ";hidden=" + std::to_string(c.hidden) + ";heads=" + std::to_string(c.n_heads) + "/" +
         std::to_string(c.n_kv_heads) + ";vocab=" + std::to_string(c.vocab_size) + ";adapters=;codec=" +
         codec_namespace(o.kv_codecs) + ";block=" + std::to_string(o.block_size);
}

}  // namespace

Status Engine::check_model(const Model& model) {
  const auto kv = model.kv_layout();
  bool any_kv = false;
  for (size_t l = 0; l < kv.size(); ++l) {
    if (!kv[l].has_kv) continue;
    any_kv = true;
    const int32_t owner = kv[l].shares_with;
    if (owner < 0) continue;
    if (owner >= int32_t(kv.size()) || !kv[size_t(owner)].has_kv || kv[size_t(owner)].shares_with >= 0) {
      return make_error(ErrorCode::kUnsupported, "layer " + std::to_string(l) + " shares the KV of layer " +
                                                     std::to_string(owner) + ", which owns none");
    }
    // The two kinds page in different pools: a sharer must read the pool its owner writes, and
    // see no further back than the owner keeps.
    if ((kv[l].window > 0) != (kv[size_t(owner)].window > 0) || kv[l].window > kv[size_t(owner)].window) {
      return make_error(ErrorCode::kUnsupported,
                        "layer " + std::to_string(l) + " (window " + std::to_string(kv[l].window) +
                            ") shares the KV of layer " + std::to_string(owner) + " (window " +
                            std::to_string(kv[size_t(owner)].window) + "); sharing across attention kinds is not supported");
    }
  }
  if (!any_kv) {
    return make_error(ErrorCode::kUnsupported,
                      "model type '" + model.config().model_type + "' has no attention KV; the engine pages attention layers");
  }
  return Status();
}

Result<std::vector<KvLayerSpec>> resolve_kv_layout(const Model& model, const KvCodecConfig& config) {
  if (config.quant_start > 0) {
    return make_error(ErrorCode::kUnsupported, "--kv-quant-start " + std::to_string(config.quant_start) +
                                                   ": converting a sequence's exact KV to the codec after a number of "
                                                   "tokens runs in the engine only (use 0 here)");
  }
  std::vector<KvLayerSpec> layout = model.kv_layout();
  std::vector<KvCodecLayerDims> dims(layout.size());
  for (size_t l = 0; l < layout.size(); ++l) {
    dims[l] = {layout[l].has_kv, layout[l].shares_with, layout[l].head_dim_k, layout[l].head_dim_v};
  }
  auto specs = resolve_kv_codecs(config, dims);
  if (!specs.ok()) return specs.error();
  for (size_t l = 0; l < layout.size(); ++l) layout[l].codec = (*specs)[l];
  return layout;
}

Result<Engine::KvPlan> Engine::plan_blocks(const Model& model, const EngineOptions& o) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  if (o.max_queued < 1) return bad("max_queued must be >= 1, got " + std::to_string(o.max_queued));
  if (o.session_ttl_s < 0) return bad("session_ttl must be >= 0, got " + std::to_string(o.session_ttl_s));
  const int32_t max_pos = model.config().max_position;
  if (o.max_model_len < 0 || (max_pos > 0 && o.max_model_len > max_pos)) {
    return bad("max_model_len must be in [1, " + std::to_string(max_pos) + "] (the model's max_position_embeddings), got " +
               std::to_string(o.max_model_len));
  }
  if (o.max_model_len == 0 && max_pos <= 0) return bad("max_model_len must be set: the model config gives no maximum position");
  const int32_t max_len = o.max_model_len > 0 ? o.max_model_len : max_pos;
  if (o.kv_codecs.quant_start < 0) return bad("--kv-quant-start must be >= 0, got " + std::to_string(o.kv_codecs.quant_start));

  KvPlan plan;
  const bool quant = o.kv_codecs.quant_start > 0;  // the pool holds exact KV; the codecs go to a second one
  auto layout = resolve_kv_layout(model, quant ? KvCodecConfig{} : o.kv_codecs);
  if (!layout.ok()) return layout.error();
  plan.layout = std::move(layout).value();
  if (quant) {
    auto q = kv_quant_layout(model, o);
    if (!q.ok()) return q.error();
    plan.quant_layout = std::move(q).value();
    // The codec pool holds the full-attention layers' blocks only (windows stay exact).
    for (const auto& s : plan.quant_layout) {
      if (converts(s)) plan.shape.quant_bytes_per_token += KvStorage::layer_bytes_per_token(s);
    }
  }
  for (const auto& s : plan.layout) {
    if (!s.has_kv || s.shares_with >= 0) continue;
    const int64_t b = KvStorage::layer_bytes_per_token(s);  // in the layer's codec
    if (s.window > 0) {
      plan.shape.window_bytes_per_token += b;
      plan.shape.window = std::max(plan.shape.window, s.window);
    } else {
      plan.shape.full_bytes_per_token += b;
    }
  }
  int32_t chunk = 1;  // the recurrent layers' prefill chunk: cuts and snapshots align to it
  for (const auto& s : model.state_layout()) {
    plan.shape.has_state = plan.shape.has_state || s.has_state;
    if (s.has_state && s.prefill_chunk > 1) chunk = std::lcm(chunk, s.prefill_chunk);
  }
  const int32_t snap = std::lcm(chunk, std::max(o.block_size, 1));
  if (plan.shape.has_state && o.prefix_caching && (o.state_snapshot_interval < 1 || o.state_snapshot_interval % snap != 0)) {
    return bad("state_snapshot_interval must be a positive multiple of " + std::to_string(snap) + " (block_size " +
               std::to_string(o.block_size) + (chunk > 1 ? ", prefill chunk " + std::to_string(chunk) : std::string()) +
               "), got " + std::to_string(o.state_snapshot_interval));
  }
  if (plan.shape.has_state && o.state_snapshot_bytes < 0) {
    return bad("state_snapshot_bytes must be >= 0, got " + std::to_string(o.state_snapshot_bytes));
  }
  auto pools = plan_kv_pools(plan.shape, o, max_len, o.kv_codecs.quant_start);
  if (!pools.ok()) return pools.error();
  plan.pools = *pools;
  return plan;
}

Result<std::string> describe_kv_plan(const Model& model, const EngineOptions& options) {
  auto plan = Engine::plan_blocks(model, options);
  if (!plan.ok()) return plan.error();
  return plan->pools.describe(plan->shape, options.block_size);
}

int32_t default_kv_quant_start(const Model& model, const EngineOptions& o, const StepExecutor* executor) {
  if (executor != nullptr && executor->n_kv_quant_blocks() == 0) return 0;
  if (o.kv_host_bytes > 0 || !o.kv_disk_dir.empty()) return 0;
  for (const auto& s : model.state_layout()) {
    if (s.has_state) return 0;
  }
  KvCodecConfig codecs = o.kv_codecs;
  codecs.quant_start = 0;
  auto layout = resolve_kv_layout(model, codecs);
  if (!layout.ok()) return 0;  // plan_blocks reports it
  bool quantized = false;
  for (const auto& s : *layout) {
    if (s.has_kv && s.window > 0) return 0;
    const KvCodec c = s.codec.codec;
    quantized = quantized || (s.has_kv && s.shares_with < 0 && c != KvCodec::kAuto && c != KvCodec::kBf16);
  }
  return quantized ? o.block_size : 0;
}

namespace {

// Engine options from an executor's pools: the engine plans with exactly its blocks, and its
// codec pool (if any) is --kv-quant-start's. Resolves --kv-quant-start auto.
Status adopt_executor_pools(const Model& model, const StepExecutor* executor, EngineOptions* o) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  if (executor != nullptr) {
    if (o->kv_blocks != 0 && o->kv_blocks != executor->n_kv_blocks()) {
      return bad("kv_blocks " + std::to_string(o->kv_blocks) + " differs from the executor's KV pool of " +
                 std::to_string(executor->n_kv_blocks()) + " blocks");
    }
    o->kv_blocks = executor->n_kv_blocks();
    if (const int32_t w = executor->n_kv_window_blocks(); w > 0) {
      if (o->kv_window_blocks != 0 && o->kv_window_blocks != w) {
        return bad("kv_window_blocks " + std::to_string(o->kv_window_blocks) + " differs from the executor's window pool of " +
                   std::to_string(w) + " blocks");
      }
      o->kv_window_blocks = w;
    }
  }
  if (o->kv_codecs.quant_start == KvCodecConfig::kQuantStartAuto) {
    o->kv_codecs.quant_start = default_kv_quant_start(model, *o, executor);
  }
  if (executor != nullptr) {
    const int32_t q = executor->n_kv_quant_blocks();
    if ((q > 0) != (o->kv_codecs.quant_start > 0)) {
      return bad("--kv-quant-start " + std::to_string(o->kv_codecs.quant_start) + " does not match the executor's " +
                 (q > 0 ? "codec pool of " + std::to_string(q) + " blocks" : std::string("single KV pool")));
    }
    if (q > 0) {
      if (o->kv_quant_blocks != 0 && o->kv_quant_blocks != q) {
        return bad("kv_quant_blocks " + std::to_string(o->kv_quant_blocks) + " differs from the executor's codec pool of " +
                   std::to_string(q) + " blocks");
      }
      o->kv_quant_blocks = q;
    }
  }
  return Status();
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Model> model, EngineOptions options) {
  return create(std::move(model), std::move(options), nullptr);
}

Result<std::unique_ptr<Engine>> Engine::create(std::unique_ptr<Model> model, EngineOptions options,
                                               std::unique_ptr<StepExecutor> executor) {
  if (!model) return make_error(ErrorCode::kInvalidArgument, "no model");
  STRATA_RETURN_IF_ERROR(adopt_executor_pools(*model, executor.get(), &options));
  STRATA_RETURN_IF_ERROR(check_model(*model));
  STRATA_RETURN_IF_ERROR(plan_blocks(*model, options));
  STRATA_RETURN_IF_ERROR(make_scheduling_policy(options.scheduling_policy));
  STRATA_RETURN_IF_ERROR(check_speculative(*model, options, executor.get()));
  if (!options.lora_slots.empty() && executor) {
    return make_error(ErrorCode::kUnsupported, "LoRA adapters run on the cpu engine only so far (--device cpu)");
  }
  for (const auto& [name, slot] : options.lora_slots) {
    if (slot < 0 || size_t(slot) >= model->lora_slots().size()) {
      return make_error(ErrorCode::kInvalidArgument, "adapter '" + name + "' names slot " + std::to_string(slot) +
                                                         " of a model with " + std::to_string(model->lora_slots().size()));
    }
  }
  try {
    return std::make_unique<Engine>(std::move(model), std::move(options), std::move(executor));
  } catch (const std::invalid_argument& e) {  // a KV tier that cannot open (names its directory)
    return make_error(ErrorCode::kInvalidArgument, e.what());
  }
}

Engine::Engine(std::unique_ptr<Model> model, EngineOptions options, std::unique_ptr<StepExecutor> executor)
    : model_(std::move(model)), options_(std::move(options)), queue_(std::max(options_.max_queued, 1)), t0_(Clock::now()) {
  if (!model_) throw std::invalid_argument("no model");
  if (auto st = adopt_executor_pools(*model_, executor.get(), &options_); !st.ok()) {
    throw std::invalid_argument(st.error().message);
  }
  if (auto s = check_model(*model_); !s.ok()) throw std::invalid_argument(s.error().message);
  auto kv_plan = plan_blocks(*model_, options_);
  if (!kv_plan.ok()) throw std::invalid_argument(kv_plan.error().message);
  auto policy = make_scheduling_policy(options_.scheduling_policy);
  if (!policy.ok()) throw std::invalid_argument(policy.error().message);
  if (auto s = check_speculative(*model_, options_, executor.get()); !s.ok()) throw std::invalid_argument(s.error().message);
  lora_.reserve_slots(int32_t(model_->lora_slots().size()));
  for (const auto& [name, slot] : options_.lora_slots) lora_.add_installed(name, slot, model_->lora_slots()[size_t(slot)]->content_hash);
  n_blocks_ = kv_plan->pools.n_blocks;
  n_window_blocks_ = kv_plan->pools.n_window_blocks;
  max_model_len_ = options_.max_model_len > 0 ? options_.max_model_len : model_->config().max_position;
  eos_ids_ = options_.eos_ids.empty() ? model_->config().eos_ids : options_.eos_ids;
  SchedulerOptions so;
  static_cast<StepLimits&>(so) = options_;
  so.prefix_caching = options_.prefix_caching;
  kv_bytes_per_token_ = KvStorage::bytes_per_token(kv_plan->layout);
  prefix_namespace_ = namespace_identity(*model_, options_);
  so.prefix_salt = prefix_namespace_salt(prefix_namespace_);
  if (kv_plan->pools.n_quant_blocks > 0) {
    // Exact blocks live under the exact namespace, converted ones under the codecs' (KvConversion).
    prefix_namespace_ += ";quant_start=" + std::to_string(options_.kv_codecs.quant_start);
    EngineOptions exact = options_;
    exact.kv_codecs = KvCodecConfig{};
    so.prefix_salt = prefix_namespace_salt(namespace_identity(*model_, exact));
  }
  so.window = kv_plan->shape.window;
  so.n_state_slots = kv_plan->pools.n_state_slots;
  so.state_snapshot_interval = options_.state_snapshot_interval;
  for (const auto& s : model_->state_layout()) {
    if (s.has_state && s.prefill_chunk > 1) so.state_chunk = std::lcm(std::max(so.state_chunk, 1), s.prefill_chunk);
  }
  core_ = std::make_unique<Core>(*model_, *kv_plan, options_, so, std::move(policy).value(), std::move(executor));
  if (kv_plan->pools.n_quant_blocks > 0) {
    n_quant_blocks_ = kv_plan->pools.n_quant_blocks;
    const uint64_t codec_salt = prefix_namespace_salt(prefix_namespace_);
    if (auto* host = dynamic_cast<ModelRunner*>(&core_->runner); host != nullptr) {
      core_->conversion = std::make_unique<KvConversion>(options_.kv_codecs.quant_start, n_quant_blocks_, codec_salt,
                                                         core_->kv, host->kv_storage(), kv_plan->quant_layout);
    } else {
      // adopt_executor_pools made the plan's codec pool the executor's.
      STRATA_CHECK(core_->runner.n_kv_quant_blocks() == n_quant_blocks_, "the codec pool is the executor's");
      core_->conversion = std::make_unique<KvConversion>(options_.kv_codecs.quant_start, codec_salt, core_->kv, core_->runner);
    }
    core_->sched.set_kv_conversion(core_->conversion.get());
  }
  core_->stats.alive = true;
  core_->stats.kv = core_->kv.stats(0.0);
  if (core_->kv_window) core_->stats.kv_window = core_->kv_window->stats(0.0);
  queue_.publish_stats(core_->stats);
  setup_kv_tiers();
  setup_checkpoints();
  setup_speculation();
  setup_overlap();
}

void Engine::setup_checkpoints() {
  if (options_.checkpoint_every < 0) {
    throw std::invalid_argument("checkpoint_every must be >= 0, got " + std::to_string(options_.checkpoint_every));
  }
  if (options_.checkpoint_every == 0) return;
  if (options_.checkpoint_store != "file" && options_.checkpoint_store != "redis") {
    throw std::invalid_argument("--checkpoint-store must be file or redis, got '" + options_.checkpoint_store + "'");
  }
  if (options_.checkpoint_queue_bytes < 1) {
    throw std::invalid_argument("checkpoint_queue_bytes must be >= 1, got " + std::to_string(options_.checkpoint_queue_bytes));
  }
  if (core_->tiers && core_->tiers->disk()) {
    Core* c = core_.get();
    c->ckpt_io = std::make_unique<CheckpointBlocks>(
        c->runner, c->kv, [this] { return now_s(); }, *c->tiers->disk(), c->tiers->block_bytes(), kCheckpointStagingBytes,
        [c](uint64_t id, int32_t index) {
          // Dropped by the disk tier: the sequence's next checkpoint hands the block over again.
          auto it = c->active.find(id);
          if (it != c->active.end()) it->second->ckpt_blocks = std::min(it->second->ckpt_blocks, index);
        });
  }
  if (options_.checkpoint_store == "redis") {
    if (options_.kv_redis_url.empty()) throw std::invalid_argument("--checkpoint-store redis needs --kv-redis-url");
    auto url = parse_redis_url(options_.kv_redis_url);
    if (!url.ok()) throw std::invalid_argument("--kv-redis-url: " + url.error().message);
    auto store = CheckpointStore::open_redis(*url, prefix_namespace_);
    if (!store.ok()) throw std::invalid_argument("--checkpoint-store redis: " + store.error().message);
    core_->checkpoints = std::move(store).value();
    core_->ckpt_writer = std::make_unique<CheckpointWriter>(*core_->checkpoints, size_t(options_.checkpoint_queue_bytes));
    return;
  }
  std::string dir = options_.checkpoint_dir;
  if (dir.empty() && !options_.kv_disk_dir.empty()) dir = (std::filesystem::path(options_.kv_disk_dir) / "checkpoints").string();
  if (dir.empty()) throw std::invalid_argument("checkpoint_every " + std::to_string(options_.checkpoint_every) +
                                               " needs checkpoint_dir or kv_disk_dir");
  if (!core_->tiers || !core_->tiers->disk()) {
    log::warn("generation checkpoints without a disk KV tier: a resumed request recomputes its KV");
  }
  auto store = CheckpointStore::open(dir, prefix_namespace_);
  if (!store.ok()) throw std::invalid_argument(store.error().message);
  core_->checkpoints = std::move(store).value();
  core_->ckpt_writer = std::make_unique<CheckpointWriter>(*core_->checkpoints, size_t(options_.checkpoint_queue_bytes));
}

void Engine::resume_from_checkpoint(Active& a) {
  auto c = core_->checkpoints->load(a.ckpt_key);
  if (!c) return;
  const int32_t vocab = model_->config().vocab_size;
  bool valid = int32_t(c->generated.size()) < a.req.max_tokens;
  for (int32_t id : c->generated) valid = valid && id < vocab;
  auto sampler = Sampler::restore(c->sampler);
  if (!valid || !sampler.ok()) {
    log::warn("checkpoint of request {} does not fit it ({}); running it from the start", a.req.id,
              sampler.ok() ? "generated ids" : sampler.error().to_string());
    return;
  }
  if (!replay_grammar(a, c->generated)) {
    log::warn("checkpoint of request {} does not fit its grammar; running it from the start", a.req.id);
    return;
  }
  log::info("request {} resumes from its checkpoint after {} generated tokens", a.req.id, c->generated.size());
  a.sampler = std::move(sampler).value();
  a.seq.tokens.insert(a.seq.tokens.end(), c->generated.begin(), c->generated.end());
  a.n_generated = int32_t(c->generated.size());
  a.last_token = Clock::now();
  // The client's stream is complete: what was generated before the checkpoint comes first.
  StreamEvent e;
  e.tokens = std::move(c->generated);
  a.channel->push(std::move(e));
}

void Engine::share_blocks(Active& a) {
  if (!core_->tiers || core_->tiers->redis() == nullptr) return;
  const Sequence& seq = a.seq;
  const int32_t n = std::min<int32_t>(seq.n_published, int32_t(std::min(seq.blocks.size(), seq.block_hashes.size())));
  for (int32_t i = a.shared_blocks; i < n; ++i) {
    const uint64_t h = seq.block_hashes[size_t(i)];
    if (!core_->tiers->shares(h)) continue;  // written or read by this process already
    try {
      core_->runner.read_block(seq.blocks[size_t(i)], core_->tier_buf.data());
    } catch (const std::exception& e) {
      log::warn("shared KV tier: blocks of request {} not shared: {}", a.req.id, e.what());
      return;
    }
    core_->tiers->share(h, core_->tier_buf.data());
  }
  a.shared_blocks = std::max(a.shared_blocks, n);
}

void Engine::write_checkpoint(Active& a) {
  const auto t0 = core_->profile.on ? Clock::now() : Clock::time_point{};
  Sequence& seq = a.seq;
  share_blocks(a);
  if (core_->ckpt_io) {
    // New full blocks go to the disk tier behind the device's queue (CheckpointBlocks): none is
    // read here. With the staging full the rest wait for the next checkpoint.
    DiskTier& disk = *core_->tiers->disk();
    const int32_t n = std::min<int32_t>(seq.n_published, int32_t(std::min(seq.blocks.size(), seq.block_hashes.size())));
    for (int32_t i = a.ckpt_blocks; i < n; ++i) {
      const uint64_t h = seq.block_hashes[size_t(i)];
      if (!disk.contains(h) && !core_->ckpt_io->add(seq.id, i, seq.blocks[size_t(i)], h)) break;
      a.ckpt_blocks = i + 1;
    }
  }
  Checkpoint c;
  c.key = a.ckpt_key;
  c.run = a.ckpt_run;
  c.generation = a.n_generated;
  c.generated.assign(seq.tokens.begin() + seq.n_prompt, seq.tokens.end());
  // An overlapped step already drew the next token's value: the state from before that draw.
  c.sampler = a.ckpt_rng_gen == a.n_generated ? a.sampler.save(a.ckpt_rng) : a.sampler.save();
  core_->ckpt_writer->write(std::move(c));  // a full queue drops it (counted): the next one carries on
  if (core_->profile.on) core_->profile.checkpoint_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void Engine::pump_checkpoint_blocks(bool wait) {
  if (!core_->ckpt_io) return;
  try {
    core_->ckpt_io->issue();
    core_->ckpt_io->settle(wait);
  } catch (const std::exception& e) {
    // The blocks are handed over again by their sequences' next checkpoints.
    log::warn("checkpoint blocks not copied to the host: {}", e.what());
  }
}

namespace {

int64_t sum_bytes(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t(0)); }

// Part `w` of `total` by weight (w / all), at least `floor`.
int64_t share(int64_t total, double w, double all, int64_t floor) {
  return std::max(floor, int64_t(double(total) * (w / all)));
}

}  // namespace

void Engine::setup_kv_tiers() {
  if (options_.kv_host_bytes < 0) {
    throw std::invalid_argument("kv_host_bytes must be >= 0, got " + std::to_string(options_.kv_host_bytes));
  }
  if (options_.kv_host_bytes <= 0 && options_.kv_disk_dir.empty() && options_.kv_redis_url.empty()) return;
  if (!options_.prefix_caching) {
    log::warn("KV tiers are off: prefix caching is off");
    return;
  }
  const std::vector<int64_t> tensors = core_->runner.block_tensor_bytes();
  const std::vector<int64_t> window_tensors =
      core_->kv_window ? core_->runner.window_block_tensor_bytes() : std::vector<int64_t>{};
  const int64_t full_bb = sum_bytes(tensors), window_bb = sum_bytes(window_tensors);
  const int64_t state_bb = core_->snapshots ? core_->runner.state_floats() * int64_t(sizeof(float)) : 0;
  if (full_bb == 0 || (core_->kv_window && window_bb == 0)) {
    log::warn("KV tiers are off: {}", full_bb == 0 ? "every attention layer of the model has a sliding window"
                                                   : "the executor does not copy its sliding-window pool");
    return;
  }
  // The budgets split by what one block of tokens costs in each: a full block, a window block,
  // and a snapshot's share (one per state_snapshot_interval tokens). Snapshots take no host
  // bytes here: the snapshot store is their host memory (state_snapshot_bytes).
  const double per_block_state =
      state_bb > 0 ? double(state_bb) * options_.block_size / std::max(options_.state_snapshot_interval, 1) : 0.0;
  const double host_all = double(full_bb + window_bb), disk_all = host_all + per_block_state;
  std::string identity = namespace_identity(*model_, options_) + ";tensors=";
  for (int64_t b : tensors) identity += std::to_string(b) + ",";
  std::unique_ptr<RedisTier> redis;
  if (!options_.kv_redis_url.empty()) {
    auto url = parse_redis_url(options_.kv_redis_url);
    if (!url.ok()) throw std::invalid_argument("--kv-redis-url: " + url.error().message);
    RedisTierOptions ro;
    ro.url = *url;
    ro.queue_bytes = options_.kv_redis_queue_bytes;
    ro.identity = identity;
    for (int64_t b : tensors) ro.block_bytes += b;
    auto r = RedisTier::open(std::move(ro));
    if (!r.ok()) throw std::invalid_argument("--kv-redis-url: " + r.error().message);
    redis = std::move(r).value();
  }
  const bool companions = window_bb > 0 || state_bb > 0;
  const int64_t host_full = companions && options_.kv_host_bytes > 0
                                ? share(options_.kv_host_bytes, double(full_bb), host_all, full_bb)
                                : options_.kv_host_bytes;
  const int64_t disk_full = companions ? share(options_.kv_disk_bytes, double(full_bb), disk_all, full_bb)
                                       : options_.kv_disk_bytes;
  auto tiers = make_kv_tiers(tensors, identity, host_full, options_.kv_disk_dir, disk_full,
                             options_.kv_disk_read_delay_s, std::move(redis));
  if (!tiers.ok()) throw std::invalid_argument(tiers.error().message);
  core_->tiers = std::move(tiers).value();
  core_->tier_buf.resize(size_t(core_->tiers->block_bytes()));
  Core* c = core_.get();
  const std::filesystem::path disk_dir(options_.kv_disk_dir);
  TierCompanions comp;
  if (window_bb > 0) {
    // Window blocks under the same chain hashes as the full blocks, in their own tiers.
    std::string wid = identity + ";pool=window;tensors=";
    for (int64_t b : window_tensors) wid += std::to_string(b) + ",";
    auto w = make_kv_tiers(window_tensors, wid,
                           options_.kv_host_bytes > 0 ? share(options_.kv_host_bytes, double(window_bb), host_all, window_bb) : 0,
                           disk_dir.empty() ? std::string() : (disk_dir / "window").string(),
                           share(options_.kv_disk_bytes, double(window_bb), disk_all, window_bb), options_.kv_disk_read_delay_s);
    if (!w.ok()) throw std::invalid_argument(w.error().message);
    c->window_tiers = std::move(w).value();
    c->kv_window->set_evict_hook([c](int32_t block, uint64_t hash) {
      c->window_demote_blocks.push_back(block);
      c->window_demote_hashes.push_back(hash);
      if (c->window_demote_blocks.size() * size_t(c->window_tiers->block_bytes()) >= Core::kDemoteBatchBytes) c->flush_demotions();
    });
    comp.window_kv = c->kv_window.get();
    comp.window_tiers = c->window_tiers.get();
    comp.window = c->sched.options().window;
    comp.install_window = [c](std::span<const int32_t> blocks, const uint8_t* bytes) {
      c->flush_demotions();
      c->runner.write_window_blocks(blocks, bytes);
    };
  }
  if (state_bb > 0) {
    comp.snapshots = c->snapshots.get();
    comp.state_floats = c->runner.state_floats();
    if (!disk_dir.empty()) {
      // Snapshots the store drops for room, and those it holds at shutdown, go to disk.
      auto st = make_kv_tiers({state_bb}, identity + ";pool=state;floats=" + std::to_string(comp.state_floats), 0,
                              (disk_dir / "state").string(), share(options_.kv_disk_bytes, per_block_state, disk_all, state_bb),
                              options_.kv_disk_read_delay_s);
      if (!st.ok()) throw std::invalid_argument(st.error().message);
      c->state_tiers = std::move(st).value();
      comp.state_tiers = c->state_tiers.get();
      c->snapshots->set_evict_hook([c](uint64_t hash, const StateSnapshot& snap) {
        if (!c->state_tiers->contains(hash)) c->state_tiers->demote(hash, reinterpret_cast<const uint8_t*>(snap.data.data()));
      });
    }
  }
  // Demotions and promotions copy blocks straight between the pool and host slots (a device: DMA).
  if (const std::span<uint8_t> host = c->tiers->host_memory(); !host.empty()) {
    c->host_tier_registered = c->runner.register_host_memory(host.data(), host.size());
  }
  c->kv.set_evict_hook([c](int32_t block, uint64_t hash) {
    c->demote_blocks.push_back(block);
    c->demote_hashes.push_back(hash);
    if (c->demote_blocks.size() * c->tier_buf.size() >= Core::kDemoteBatchBytes) c->flush_demotions();
  });
  // New sequences promote through the promoter (tier reads on its thread, installs here); the
  // scheduler's in-step fallback (a preempted sequence's re-admission) takes only host-memory
  // blocks, never a disk read.
  c->sched.set_lower_tiers([c](uint64_t hash) { return c->tiers->contains_host(hash); },
                           [c](uint64_t hash, int32_t block) {
                             if (!c->tiers->fetch(hash, c->tier_buf.data())) return false;
                             c->flush_demotions();
                             c->runner.write_block(block, c->tier_buf.data());
                             return true;
                           });
  c->promoter = std::make_unique<TierPromoter>(
      c->kv, *c->tiers, c->sched.options().prefix_salt, c->tiers->block_bytes(),
      [c](std::span<const int32_t> blocks, std::span<const uint8_t* const> srcs) {
        c->flush_demotions();
        c->runner.write_blocks_from(blocks, srcs);
      },
      std::move(comp));
}

bool Engine::flush_kv_tiers(double timeout_s) {
  if (!core_ || !core_->tiers) return true;
  bool ok = core_->tiers->flush(timeout_s);
  if (core_->window_tiers) ok = core_->window_tiers->flush(timeout_s) && ok;
  if (core_->state_tiers) ok = core_->state_tiers->flush(timeout_s) && ok;
  return ok;
}

Status Engine::load_lora(const std::string& name, const std::string& dir, int32_t max_rank) {
  if (name.empty()) return make_error(ErrorCode::kInvalidArgument, "an adapter needs a name");
  if (core_->runner.device_argmax()) {
    return make_error(ErrorCode::kUnsupported, "LoRA adapters run on the cpu engine only so far (--device cpu)");
  }
  auto a = model_->load_lora(dir, max_rank);  // reads only the model's config: safe beside steps
  if (!a.ok()) return a.error();
  return lora_.add(name, std::move(a).value());
}

Status Engine::unload_lora(const std::string& name) { return lora_.remove(name); }

bool Engine::flush_checkpoints(double timeout_s) {
  return !core_ || !core_->ckpt_writer || core_->ckpt_writer->flush(timeout_s);
}

Engine::~Engine() { shutdown(); }

void Engine::start() {
  if (started_.exchange(true)) return;
  alive_ = true;
  thread_ = std::thread([this] { run_loop(); });
}

void Engine::shutdown() {
  stop_ = true;
  queue_.close();
  if (thread_.joinable()) thread_.join();
  if (core_) pump_checkpoint_blocks(true);  // every checkpoint's blocks reach the disk tier
  if (!started_.exchange(true)) fail_all("the engine was shut down", true);  // never started: end what was queued
  alive_ = false;
  if (core_ && core_->ckpt_writer && !core_->ckpt_writer->flush(options_.kv_flush_timeout_s)) {
    log::warn("checkpoints: the writer queue did not drain within {} s", options_.kv_flush_timeout_s);
  }
  if (core_ && core_->tiers && !tiers_persisted_) {
    // The pool's cached blocks go down to disk too, so a restart finds them.
    tiers_persisted_ = true;
    const BlockPool& pool = core_->kv.pool();
    core_->flush_demotions();
    if (DiskTier* disk = core_->tiers->disk()) {
      std::vector<int32_t> ids;
      for (int32_t q = 0; q < pool.n_idle_queues(); ++q) {
        for (int32_t id = pool.idle_front(q); id >= 0; id = pool.idle_next(id)) ids.push_back(id);
      }
      // Read in batches (one device transfer per batch, StepExecutor::read_blocks).
      const size_t bb = core_->tier_buf.size();
      const size_t batch = std::max<size_t>(1, (size_t(64) << 20) / std::max<size_t>(bb, 1));
      std::vector<uint8_t> bytes(std::min(batch, ids.size()) * bb);
      for (size_t i = 0; i < ids.size(); i += batch) {
        const size_t n = std::min(batch, ids.size() - i);
        core_->runner.read_blocks(std::span<const int32_t>(ids).subspan(i, n), bytes.data());
        for (size_t k = 0; k < n; ++k) {
          const uint64_t hash = pool.meta(ids[i + k]).hash;
          // A full writer queue drains first: shutdown keeps every cached block it can.
          if (!disk->enqueue(hash, bytes.data() + k * bb) && core_->tiers->flush(options_.kv_flush_timeout_s)) {
            disk->enqueue(hash, bytes.data() + k * bb);
          }
        }
      }
    }
    persist_companions();
    if (!flush_kv_tiers(options_.kv_flush_timeout_s)) {
      log::warn("KV disk tier: the writer queue did not drain within {} s", options_.kv_flush_timeout_s);
    }
  }
}

void Engine::persist_companions() {
  // The window pool's cached blocks and the snapshot store's snapshots, as the full pool's.
  if (core_->window_tiers) {
    if (DiskTier* disk = core_->window_tiers->disk()) {
      const BlockPool& pool = core_->kv_window->pool();
      std::vector<int32_t> ids;
      for (int32_t q = 0; q < pool.n_idle_queues(); ++q) {
        for (int32_t id = pool.idle_front(q); id >= 0; id = pool.idle_next(id)) {
          if (!core_->window_tiers->contains(pool.meta(id).hash)) ids.push_back(id);
        }
      }
      const size_t wb = size_t(core_->window_tiers->block_bytes());
      const size_t batch = std::max<size_t>(1, (size_t(64) << 20) / std::max<size_t>(wb, 1));
      std::vector<uint8_t> bytes(std::min(batch, ids.size()) * wb);
      for (size_t i = 0; i < ids.size(); i += batch) {
        const size_t n = std::min(batch, ids.size() - i);
        core_->runner.read_window_blocks(std::span<const int32_t>(ids).subspan(i, n), bytes.data());
        for (size_t k = 0; k < n; ++k) {
          const uint64_t hash = pool.meta(ids[i + k]).hash;
          if (!disk->enqueue(hash, bytes.data() + k * wb) && core_->window_tiers->flush(options_.kv_flush_timeout_s)) {
            disk->enqueue(hash, bytes.data() + k * wb);
          }
        }
      }
    }
  }
  if (core_->state_tiers && core_->snapshots) {
    DiskTier* disk = core_->state_tiers->disk();
    core_->snapshots->for_each([&](uint64_t hash, const StateSnapshot& snap) {
      if (disk == nullptr || disk->contains(hash)) return;
      const auto* bytes = reinterpret_cast<const uint8_t*>(snap.data.data());
      if (!disk->enqueue(hash, bytes) && core_->state_tiers->flush(options_.kv_flush_timeout_s)) disk->enqueue(hash, bytes);
    });
  }
}

bool Engine::cancel(const std::string& id) { return queue_.cancel(id); }

EngineStats Engine::stats() const {
  EngineStats s = queue_.stats();
  s.alive = alive_.load();
  return s;
}

double Engine::now_s() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

Result<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest r) {
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  const int32_t vocab = model_->config().vocab_size;
  if (r.id.empty()) return bad("request id must not be empty");
  if (r.prompt.empty()) return bad("prompt must hold at least one token");
  for (size_t i = 0; i < r.prompt.size(); ++i) {
    if (r.prompt[i] < 0 || r.prompt[i] >= vocab) {
      return bad("prompt token " + std::to_string(r.prompt[i]) + " at index " + std::to_string(i) +
                 " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
  if (r.max_tokens < 1) return bad("max_tokens must be >= 1, got " + std::to_string(r.max_tokens));
  if (r.embed != model_->config().hidden_output) {
    return bad(r.embed ? "the model is not served for embeddings (serve it with --task embed)"
                       : "the model is served for embeddings (--task embed): it does not generate");
  }
  if (r.embed) {
    if (r.logprobs >= 0 || r.prompt_logprobs || r.grammar != nullptr) {
      return bad("an embedding request takes no logprobs, prompt logprobs or grammar");
    }
    r.max_tokens = 1;  // its KV reservation: the prompt's blocks
    r.speculative = false;
  }
  const int64_t n_prompt = int64_t(r.prompt.size());
  if (n_prompt + r.max_tokens > max_model_len_) {
    return bad("prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
               ") = " + std::to_string(n_prompt + r.max_tokens) + " exceeds max_model_len " + std::to_string(max_model_len_));
  }
  const int64_t blocks = (n_prompt + r.max_tokens + options_.block_size - 1) / options_.block_size;
  const int64_t capacity = int64_t(n_blocks_) + n_quant_blocks_;  // both pools under --kv-quant-start
  if (blocks > capacity) {
    return bad("prompt (" + std::to_string(n_prompt) + " tokens) + max_tokens (" + std::to_string(r.max_tokens) +
               ") needs " + std::to_string(blocks) + " KV blocks; the pool holds " + std::to_string(capacity));
  }
  if (r.logprobs < -1 || r.logprobs > kMaxTopLogprobs) {
    return bad("logprobs must be -1 (none) or in [0, " + std::to_string(kMaxTopLogprobs) + "], got " + std::to_string(r.logprobs));
  }
  if (r.vocab_limit < 0 || r.vocab_limit > vocab) {
    return bad("vocab_limit must be in [0, " + std::to_string(vocab) + "], got " + std::to_string(r.vocab_limit));
  }
  for (int32_t id : r.stop_ids) {
    if (id < 0 || id >= vocab) return bad("stop id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  STRATA_RETURN_IF_ERROR(check_grammar(r));
  if (r.vocab_limit > 0) {
    r.sampling.vocab_limit = r.sampling.vocab_limit > 0 ? std::min(r.sampling.vocab_limit, r.vocab_limit) : r.vocab_limit;
  }
  // A use of the adapter's slot, held until the request ends (finish(), or a refusal below).
  LoraRegistry::Ref adapter;
  if (!r.adapter.empty()) {
    auto ref = lora_.acquire(r.adapter);
    if (!ref.ok()) return ref.error();
    adapter = *ref;
  }
  std::string ckpt_key;
  if (core_->checkpoints && r.logprobs < 0 && !r.prompt_logprobs && !r.embed) {
    ckpt_key = checkpoint_key(r, eos_ids_, !r.sampling.has_seed);
    // The adapter's content: a reload of other weights under the same name is another key.
    if (!r.adapter.empty()) ckpt_key += ";adapter=" + r.adapter + "#" + std::to_string(adapter.hash);
  }
  if (!r.sampling.has_seed) {
    std::random_device rd;
    r.sampling.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
    r.sampling.has_seed = true;
  }
  auto sampler = Sampler::create(r.sampling, vocab, r.prompt);
  if (!sampler.ok()) {
    if (adapter.slot >= 0) lora_.release(adapter.slot);
    return sampler.error();
  }
  auto channel = std::make_shared<StreamChannel>();
  auto stream = std::make_shared<RequestStream>(r.id, channel);
  PendingRequest p{std::move(r), std::move(sampler).value(), channel, Clock::now(), std::move(ckpt_key), adapter.slot,
                   adapter.hash};
  if (Status st = queue_.push(std::move(p)); !st.ok()) {
    if (adapter.slot >= 0) lora_.release(adapter.slot);
    return st.error();
  }
  return stream;
}

void Engine::run_loop() {
  try {
    loop();
  } catch (const std::exception& e) {
    log::error("engine loop died: {}", e.what());
    alive_ = false;
    queue_.close();
    try {
      fail_all(std::string("the engine stopped: ") + e.what(), true);
    } catch (...) {
    }
    return;
  }
  fail_all("the engine was shut down", true);
}

void Engine::loop() {
  bool progressed = true;
  Core::LoopProfile& prof = core_->profile;
  prof.on = std::getenv("STRATA_PROFILE_STEPS") != nullptr;
  // Timestamps only while profiling: the loop runs once per step.
  auto stamp = [&prof] { return prof.on ? Clock::now() : Clock::time_point{}; };
  auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  while (!stop_.load()) {
    const bool idle = core_->active.empty();
    auto wait = idle ? std::chrono::milliseconds(100) : std::chrono::milliseconds(progressed ? 0 : 2);
    std::vector<PendingRequest> incoming = queue_.take(wait);
    const auto t_pass = stamp();
    admit_new(std::move(incoming));
    std::vector<Active*> cancelled;
    for (auto& [id, a] : core_->active) {
      if (a->channel->cancel_requested()) cancelled.push_back(a.get());
    }
    for (Active* a : cancelled) finish(*a, FinishReason::kCancelled, "");
    if (core_->promoter) for (Sequence* s : core_->promoter->poll(now_s())) core_->sched.add(s);
    progressed = true;
    if (core_->active.empty()) drain_pipeline();  // the extra tokens of ended requests
    const auto t_step = stamp();
    if (!core_->active.empty()) {
      const int64_t before = core_->stats.steps;
      step();
      progressed = core_->stats.steps != before;
    }
    const auto t_pump = stamp();
    pump_checkpoint_blocks(false);
    publish_stats();
    if (prof.on) {
      const auto t_end = Clock::now();
      prof.admit_ms += ms(t_pass, t_step);
      prof.step_ms += ms(t_step, t_pump);
      prof.pump_ms += ms(t_pump, t_end);
      prof.max_pass_ms = std::max(prof.max_pass_ms, ms(t_pass, t_end));
      ++prof.passes;
      if (core_->stats.steps - prof.logged_steps >= 256) {
        const double m = double(core_->stats.steps - prof.logged_steps);
        log::info("engine loop, per step over {} steps ({} passes): {:.3f} ms admitting, {:.3f} ms in step() (of which "
                  "{:.3f} ms writing checkpoints), {:.3f} ms handing checkpoint blocks on and stats; longest pass {:.1f} ms",
                  int64_t(m), prof.passes, prof.admit_ms / m, prof.step_ms / m, prof.checkpoint_ms / m, prof.pump_ms / m,
                  prof.max_pass_ms);
        if (core_->proposer) {
          const StepCosts& sc = core_->spec_costs;
          log::info("speculation step costs: plain {:.3f} + {:.4f} n ms, verify {:.3f} + {:.4f} n ms, draft position {:.3f} ms",
                    sc.plain.fixed_s() * 1e3, sc.plain.per_token_s() * 1e3, sc.verify.fixed_s() * 1e3,
                    sc.verify.per_token_s() * 1e3, sc.draft_position.value() * 1e3);
        }
        prof = Core::LoopProfile{true, 0, core_->stats.steps};
      }
    }
  }
}

void Engine::admit_new(std::vector<PendingRequest> incoming) {
  // Adapters loaded or freed since the last admission; a request naming a new one was
  // submitted after its load registered it, so it is installed before the request runs.
  for (auto& c : lora_.take_changes()) model_->set_lora(c.slot, std::move(c.adapter));
  for (auto& p : incoming) {
    auto a = std::make_unique<Active>(std::move(p));
    Sequence& s = a->seq;
    s.id = core_->next_id++;
    s.arrival = s.id;
    s.priority = a->req.priority;
    s.tokens = a->req.prompt;
    s.n_prompt = int32_t(s.tokens.size());
    s.prompt_logprobs = a->req.prompt_logprobs;
    s.reuse_prefix = !a->req.prompt_logprobs;  // the logits of every prompt position are needed
    if (a->adapter_slot >= 0) {
      s.adapter = a->adapter_slot;
      // A salt of the adapter's content, never 0 (0 is the base model's).
      s.hash_salt = (a->adapter_hash * 0x9E3779B97F4A7C15ull) | 1ull;
    }
    admit_grammar(*a);
    if (!a->ckpt_key.empty()) {
      a->ckpt_run = core_->checkpoints->new_run();
      resume_from_checkpoint(*a);
    }
    admit_overlap(*a);
    a->spec_on = core_->proposer != nullptr && a->req.speculative;
    Sequence* seq = &a->seq;
    core_->active.emplace(s.id, std::move(a));
    if (core_->promoter && core_->promoter->start(seq, now_s())) continue;  // scheduled once its blocks are in
    core_->sched.add(seq);
  }
}

namespace {

// Whether a plan's step needs the host between its forward and the next step: logits of every
// position (prompt logprobs), or a recurrent-state load or save around it.
bool needs_single_step(const StepPlan& plan) {
  for (const auto& span : plan.spans) {
    if (span.logits_all || span.restore_state || span.save_state) return true;
  }
  return false;
}

// Whether every span of a plan is a decode or a verify: one token and its drafts.
bool decode_only(const StepPlan& plan) {
  for (const auto& span : plan.spans) {
    if (span.n_tokens != 1 + span.n_draft) return false;
  }
  return !plan.spans.empty();
}

}  // namespace

void Engine::step() {
  // A step overlaps the one in flight only while every live request takes its tokens on the
  // device; otherwise that one is collected first and this step runs alone, planned from the
  // same state as without overlap.
  bool overlap = core_->overlap && core_->n_host_bound == 0;
  DraftChoice drafts;
  if (core_->proposer) {
    time_step_costs();
    // A step with drafts runs alone, on committed tokens; one without overlaps as plain decoding.
    if (overlap) {
      drafts = choose_drafts();
      if (drafts.any()) overlap = false;
    }
  }
  if (!overlap) {
    // The wait for a step in flight is that step's time, counted where it was queued.
    const bool timed = core_->proposer && core_->in_flight;
    const auto t = timed ? Clock::now() : Clock::time_point{};
    drain_pipeline();
    if (timed) core_->timed_step.excluded_s += std::chrono::duration<double>(Clock::now() - t).count();
  }
  const double now = now_s();
  if (core_->conversion) {
    // Sequences past --kv-quant-start move their full blocks to the codec pool before planning.
    for (Sequence* seq : core_->sched.running()) core_->conversion->convert(seq, now, options_.prefix_caching);
    core_->conversion->flush();
  }
  if (core_->proposer) {
    try {
      if (!overlap) drafts = choose_drafts();  // on the tokens the drained step committed
      propose_drafts(drafts);
    } catch (const std::exception& e) {
      // A proposer that fails costs speculation for this step, never a request's tokens.
      log::error("drafting failed: {}", e.what());
      for (Sequence* seq : core_->sched.running()) {
        seq->tokens.resize(seq->tokens.size() - size_t(seq->n_draft));
        seq->n_draft = 0;
      }
    }
  }
  StepPlan plan;
  try {
    plan = core_->sched.schedule(now);
  } catch (const InvariantError& e) {
    // The scheduler's state is suspect: end everything it held.
    log::error("scheduling failed: {}", e.what());
    fail_all(std::string("scheduling failed: ") + e.what(), false);
    return;
  }
  core_->stats.preemptions = core_->sched.n_preemptions();
  if (overlap && needs_single_step(plan)) {
    // Host rows or recurrent state: this step runs alone, after the one in flight. Requests
    // that one ends (a stop token) leave the plan; their blocks were planned for them only.
    std::vector<uint64_t> ids;
    ids.reserve(plan.spans.size());
    for (const auto& span : plan.spans) ids.push_back(span.seq->id);
    drain_pipeline();
    std::vector<ScheduledSpan> kept;
    kept.reserve(plan.spans.size());
    plan.n_tokens = 0;
    for (size_t i = 0; i < plan.spans.size(); ++i) {
      if (core_->active.count(ids[i]) == 0) continue;
      kept.push_back(plan.spans[i]);
      plan.n_tokens += plan.spans[i].n_tokens;
    }
    plan.spans = std::move(kept);
    overlap = false;
  }
  if (plan.empty()) {
    drain_pipeline();
    return;
  }
  for (const auto& span : plan.spans) {
    Active& a = *core_->active.at(span.seq->id);
    if (a.in_queue) {
      a.in_queue = false;
      a.first_scheduled = Clock::now();
      queue_.left_queue();
    }
  }
  ++core_->stats.steps;
  if (core_->proposer && decode_only(plan)) {
    // Timed to the next step's start (time_step_costs): a plain step's cost, or a verify's.
    const bool verify = std::any_of(plan.spans.begin(), plan.spans.end(), [](const ScheduledSpan& s) { return s.n_draft > 0; });
    core_->timed_step.kind = verify ? Core::TimedStep::kVerify : Core::TimedStep::kPlain;
    core_->timed_step.n_tokens = int32_t(plan.n_tokens);
    if (!verify) core_->last_plain_step = core_->stats.steps;
    // An overlapped step queued with none in flight returns at once, and its device time is
    // waited for in the next step: only one queued behind another times a step.
    if (overlap && !core_->in_flight) core_->timed_step.kind = Core::TimedStep::kNone;
  }
  if (overlap) {
    step_overlapped(plan);
    return;
  }
  try {
    for (const auto& span : plan.spans) {
      if (!span.restore_state) continue;
      const StateSnapshot* snap = core_->snapshots->find(span.restore_hash);
      STRATA_CHECK(snap != nullptr && snap->position == span.pos0, "a planned state restore has its snapshot");
      core_->runner.load_state(span.seq->state_slot, snap->data.data());
    }
    // Rows whose token is the plain argmax need no logits on the host when the executor
    // hands back its greedy tokens (a GPU: no [rows, vocab] transfer).
    // An executor that samples on its device takes the other sampled rows as RowSamples (rows
    // with logprobs only when it computes those too): the engine draws each row's random
    // value from the request's sampler here, the one draw sample() would have consumed, so
    // seeds and checkpoints stay on the host.
    std::vector<uint8_t>& want = core_->want_logits;
    std::vector<RowSample>& samples = core_->row_samples;
    const bool device_sampling = core_->runner.device_sampling();
    const bool device_logprobs = device_sampling && core_->runner.device_logprobs();
    want.clear();
    samples.clear();
    for (const auto& span : plan.spans) {
      if (span.logits_all) {
        // A verify of a request whose every token is the plain argmax reads the executor's
        // greedy tokens (a GPU: no [k + 1, vocab] transfer).
        const Active& a = *core_->active.at(span.seq->id);
        const bool argmax_verify =
            span.n_draft > 0 && core_->runner.device_argmax() && argmax_only(a.req, a.sampler, core_->runner.vocab());
        want.insert(want.end(), size_t(span.n_tokens), uint8_t(argmax_verify ? 0 : 1));
        if (device_sampling) samples.resize(want.size());
      } else if (span.sample) {
        Active& a = *core_->active.at(span.seq->id);
        const bool argmax = argmax_only(a.req, a.sampler, core_->runner.vocab());
        RowSample rs;
        if (device_sampling && !argmax && (!a.matcher || core_->runner.device_masks()) &&
            (a.req.logprobs < 0 || device_logprobs)) {
          rs.sampler = &a.sampler;
          rs.draw = a.sampler.params().greedy() ? 0 : a.sampler.next_draw();
          rs.top_logprobs = a.req.logprobs;
          if (a.matcher) {
            bool any = false;
            rs.mask = next_mask(a, &any);  // none allowed: the device answers -1
          }
        }
        want.push_back(argmax || rs.sampler != nullptr ? 0 : 1);
        if (device_sampling) samples.push_back(rs);
      }
    }
    if (core_->tiers) core_->flush_demotions();
    if (core_->runner.state_floats() > 0) {
      // A verify advances the recurrent state past drafts that may be rejected: keep the state
      // from before it, to restore and replay the kept tokens (commit_verify).
      for (const auto& span : plan.spans) {
        if (span.n_draft == 0) continue;
        Active& a = *core_->active.at(span.seq->id);
        a.spec_state.resize(size_t(core_->runner.state_floats()));
        core_->runner.save_state(span.seq->state_slot, a.spec_state.data());
      }
    }
    const StepRows& rows = core_->runner.run(plan, want, samples);
    for (const auto& span : plan.spans) {
      if (!span.save_state) continue;
      float* dst = core_->snapshots->insert(span.save_hash, span.pos0 + span.n_tokens, size_t(core_->runner.state_floats()));
      if (dst != nullptr) core_->runner.save_state(span.seq->state_slot, dst);
    }
    commit(plan, rows);
  } catch (const std::exception& e) {
    log::error("step failed: {}", e.what());
    for (const auto& span : plan.spans) {
      auto it = core_->active.find(span.seq->id);
      if (it != core_->active.end()) finish(*it->second, FinishReason::kError, std::string("step failed: ") + e.what());
    }
  }
}

void Engine::commit(const StepPlan& plan, const StepRows& rows) {
  const int32_t vocab = core_->runner.vocab();
  const float* logits = rows.logits;
  size_t row = 0;
  for (const auto& span : plan.spans) {
    Active& a = *core_->active.at(span.seq->id);
    Sequence& seq = a.seq;
    if (span.n_draft > 0) {
      commit_verify(a, span, rows, row);
      row += size_t(span.n_tokens);
      continue;
    }
    const int32_t lp_from = seq.prompt_logprob_pos;
    core_->sched.commit(span);
    const int32_t n_rows = span.logits_all ? span.n_tokens : (span.sample ? 1 : 0);
    const size_t first_row = row;
    row += size_t(n_rows);
    if (span.logits_all) {
      const float* base = logits + size_t(rows.host_row[first_row]) * size_t(vocab);
      const int32_t top_n = std::max(a.req.logprobs, 0);
      for (int32_t r = 0; r < span.n_tokens; ++r) {
        const int32_t p = span.pos0 + r;
        if (p < lp_from || p >= seq.n_prompt - 1) continue;
        TokenLogprobs t;
        const int32_t next = seq.tokens[size_t(p) + 1];
        if (!a.sampler.logprobs(base + size_t(r) * size_t(vocab), vocab, next, top_n, &t).ok()) {
          t.chosen = TokenLogprob{next, -std::numeric_limits<float>::infinity()};  // past vocab_limit
        }
        a.prompt_lp.push_back(std::move(t));
      }
      if (!a.prompt_logprobs_sent && seq.prompt_logprob_pos >= seq.n_prompt - 1) {
        a.prompt_logprobs_sent = true;
        StreamEvent e;
        e.prompt_logprobs = std::move(a.prompt_lp);
        a.channel->push(std::move(e));
      }
    }
    if (!span.sample) continue;
    const size_t last_row = first_row + size_t(n_rows - 1);
    const int32_t host_row = rows.host_row[last_row];
    const float* last = host_row >= 0 ? logits + size_t(host_row) * size_t(vocab) : nullptr;
    if (a.req.embed) {
      STRATA_CHECK(last != nullptr, "an embed row has host rows");
      a.embedding.assign(last, last + vocab);
      finish(a, FinishReason::kStop, "");
      continue;
    }
    // Without host logits the row is the executor's sampled token (a RowSample) or its greedy
    // token (argmax_only said so).
    const int32_t device_token = rows.sampled.empty() ? StepRows::kNotSampled : rows.sampled.at(last_row);
    if (last == nullptr && device_token == -1) {
      finish(a, FinishReason::kError, a.matcher ? kNoGrammarToken : "sampling failed: every logit of the row is -inf or NaN");
      continue;
    }
    STRATA_CHECK(last != nullptr || !a.matcher || device_token != StepRows::kNotSampled,
                 "a constrained row has host logits or a device-sampled token");
    const int32_t token = last != nullptr ? sample_token(a, last, vocab)
                          : device_token != StepRows::kNotSampled ? device_token
                                                                  : rows.argmax.at(last_row);
    if (token < 0) {
      finish(a, FinishReason::kError, kNoGrammarToken);
      continue;
    }
    if (last == nullptr && !accept_device_token(a, token)) continue;
    seq.tokens.push_back(token);
    if (emit_token(a, token, last, last == nullptr ? &rows : nullptr, last_row)) fill_forced(a);
  }
}

bool Engine::emit_token(Active& a, int32_t token, const float* last, const StepRows* rows, size_t row, bool in_run,
                        bool grammar_current) {
  const bool grammar = a.constrained() && grammar_current;
  if (!in_run) a.sampler.accept(token);
  ++a.n_generated;
  ++core_->stats.generated_tokens;
  const auto t = Clock::now();
  if (a.n_generated == 1) {
    core_->stats.ttft.add(std::chrono::duration<double, std::milli>(t - a.submitted).count());
  } else {
    core_->stats.inter_token.add(std::chrono::duration<double, std::milli>(t - a.last_token).count());
  }
  a.last_token = t;
  // A grammar that took a stop id has ended (its mask allows them only where it can end).
  const bool is_stop = std::find(a.req.stop_ids.begin(), a.req.stop_ids.end(), token) != a.req.stop_ids.end() ||
                       (!a.req.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end()) ||
                       (grammar && a.matcher->is_terminated());
  if (is_stop) {
    finish(a, FinishReason::kStop, "", token);
    return false;
  }
  StreamEvent e;
  e.tokens.push_back(token);
  if (a.req.logprobs >= 0) {
    TokenLogprobs lp;
    if (last != nullptr) {
      STRATA_CHECK(a.sampler.logprobs(last, core_->runner.vocab(), token, a.req.logprobs, &lp).ok(), "logprobs of a sampled token");
    } else {
      STRATA_CHECK(rows != nullptr && rows->logprobs(row, token, &lp), "the executor's logprobs of a device row");
    }
    e.logprobs.push_back(std::move(lp));
  }
  a.channel->push(std::move(e));
  if (grammar && a.matcher->is_complete()) {  // nothing can follow: the output is whole
    finish(a, FinishReason::kStop, "");
    return false;
  }
  if (a.n_generated >= a.req.max_tokens) {
    finish(a, FinishReason::kLength, "");
    return false;
  }
  if (!in_run && !a.ckpt_key.empty() && a.n_generated % options_.checkpoint_every == 0) write_checkpoint(a);
  return true;
}

void Engine::finish(Active& a, FinishReason reason, std::string message, int32_t stop_token) {
  const double now = now_s();
  const double pin = a.req.session_id.empty() ? 0.0 : now + options_.session_ttl_s;
  if (core_->promoter) core_->promoter->forget(&a.seq, now);
  if (core_->proposer) core_->proposer->forget(a.seq.id);
  if (pin > 0.0 && core_->tiers) {
    // The session's blocks stay findable in the lower tiers for the TTL, wherever they are then.
    const size_t n = std::min(size_t(std::max(a.seq.n_published, 0)), a.seq.block_hashes.size());
    core_->tiers->pin(std::span<const uint64_t>(a.seq.block_hashes).first(n), tier_clock_s() + options_.session_ttl_s);
  }
  if (reason != FinishReason::kError) share_blocks(a);
  core_->sched.finish(&a.seq, now, pin);
  if (!a.device_only) --core_->n_host_bound;
  if (a.adapter_slot >= 0) lora_.release(a.adapter_slot);
  // A finished generation is never resumed; a cancelled or failed one keeps its checkpoint.
  if (!a.ckpt_key.empty() && (reason == FinishReason::kStop || reason == FinishReason::kLength)) {
    core_->ckpt_writer->remove(a.ckpt_key, a.ckpt_run, a.n_generated);
  }
  if (a.in_queue) {
    a.in_queue = false;
    queue_.left_queue();
  }
  queue_.forget(a.req.id, a.channel.get());
  StreamEvent e;
  e.final = true;
  e.finish_reason = reason;
  e.message = std::move(message);
  e.stop_token = stop_token;
  e.usage.prompt_tokens = a.seq.n_prompt;
  e.usage.completion_tokens = a.n_generated;
  e.usage.cached_tokens = std::max(a.seq.cached_tokens, 0);
  e.usage.speculative = a.spec_on;
  e.usage.draft_tokens = a.spec_drafted;
  e.usage.accepted_tokens = a.spec_accepted;
  e.usage.fill_tokens = a.fill_tokens;
  e.usage.fill_spans = a.fill_spans;
  e.queued_ms = std::chrono::duration<double, std::milli>(a.first_scheduled.value_or(Clock::now()) - a.submitted).count();
  e.preemptions = a.seq.n_preemptions;
  e.embedding = std::move(a.embedding);
  a.channel->push(std::move(e));
  ++core_->stats.finished[int(reason)];
  core_->stats.prompt_tokens += a.seq.n_prompt;
  core_->active.erase(a.seq.id);
}

void Engine::fail_all(const std::string& message, bool drain_queue) {
  drain_pipeline();
  const FinishReason reason = stop_.load() ? FinishReason::kCancelled : FinishReason::kError;
  std::vector<Active*> all;
  for (auto& [id, a] : core_->active) all.push_back(a.get());
  std::sort(all.begin(), all.end(), [](const Active* x, const Active* y) { return x->seq.id < y->seq.id; });
  for (Active* a : all) finish(*a, reason, message);
  // Requests that never reached the engine thread.
  if (drain_queue) for (auto& p : queue_.take(std::chrono::milliseconds(0))) {
    queue_.left_queue();
    queue_.forget(p.request.id, p.channel.get());
    StreamEvent e;
    e.final = true;
    e.finish_reason = reason;
    e.message = message;
    e.usage.prompt_tokens = int32_t(p.request.prompt.size());
    if (p.adapter_slot >= 0) lora_.release(p.adapter_slot);
    p.channel->push(std::move(e));
  }
  publish_stats();
}

void Engine::publish_stats() {
  EngineStats& s = core_->stats;
  s.alive = alive_.load();
  s.running = int32_t(core_->sched.running().size());
  s.waiting = int32_t(core_->sched.waiting().size());
  s.kv = core_->kv.stats(now_s());
  if (core_->kv_window) s.kv_window = core_->kv_window->stats(now_s());
  if (core_->conversion) {
    s.kv_quant = core_->conversion->pool().stats(now_s());
    s.kv_converted_blocks = core_->conversion->converted_blocks();
  }
  if (core_->snapshots) s.state_snapshots = core_->snapshots->stats();
  if (core_->tiers) s.kv_tiers = core_->tiers->stats();
  if (core_->window_tiers) s.kv_window_tiers = core_->window_tiers->stats();
  if (core_->state_tiers) s.state_tiers = core_->state_tiers->stats();
  if (core_->checkpoints) s.checkpoints_foreign = core_->checkpoints->foreign_skipped();
  if (core_->ckpt_writer) s.checkpoints = core_->ckpt_writer->stats();
  if (core_->ckpt_io) s.checkpoint_blocks = core_->ckpt_io->stats();
  s.prefix_hit_tokens = core_->sched.prefix_hit_tokens();
  s.preemptions = core_->sched.n_preemptions();
  queue_.publish_stats(s);
}

}  // namespace strata
