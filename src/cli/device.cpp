#include "cli/device.h"

#include "core/log.h"
#include "model/registry.h"

#ifdef STRATA_WITH_CUDA
#include "runtime/cuda/cuda_executor.h"
#endif

namespace strata::cli {

bool built_with_cuda() {
#ifdef STRATA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void add_device_flags(CLI::App* cmd, DeviceArgs& a) {
  a.cmd = cmd;
  cmd->add_option("--device", a.device, "Where the model runs: auto (cuda when built with it and a GPU is present), cpu or cuda")
      ->capture_default_str();
  cmd->add_option("--gpu-memory-fraction", a.gpu_memory_fraction,
                  "--device cuda: fraction of the GPU's memory for weights, scratch and KV (KV gets the rest; default 0.9 "
                  "unless --kv-cache-bytes is given)");
  cmd->add_option("--load-format", a.load_format, "auto (the checkpoint's weights) or dummy (random weights; --device cuda)")
      ->capture_default_str();
  cmd->add_option("--quantization", a.quantization,
                  "--load-format dummy: the random weights' format: none (bf16) or fp8 (the layer matrices as "
                  "fine-grained FP8, 128x128 block scales). A checkpoint's own format comes from its config.json");
  cmd->add_flag("--deterministic", a.deterministic,
                "Batch-invariant kernels: a request's logits do not depend, bit for bit, on the other requests sharing "
                "its steps (--device cuda: fixed GEMM algorithms without split-K, no GEMV or fused decode, unsplit "
                "attention; slower). The cpu engine is batch-invariant always: there the flag changes nothing");
  cmd->add_flag("--no-async-scheduling", a.no_async_scheduling,
                "--device cuda: run steps one at a time instead of planning the next step while the GPU runs the "
                "current one (same tokens either way; for comparison and debugging)");
}

namespace {

Result<std::string> resolve_device(const DeviceArgs& d) {
  if (d.device != "auto" && d.device != "cpu" && d.device != "cuda") {
    return make_error(ErrorCode::kInvalidArgument, "--device must be auto, cpu or cuda, got '" + d.device + "'");
  }
  if (d.load_format != "auto" && d.load_format != "dummy") {
    return make_error(ErrorCode::kInvalidArgument, "--load-format must be auto or dummy, got '" + d.load_format + "'");
  }
  if (!d.quantization.empty() && d.quantization != "none" && d.quantization != "fp8") {
    return make_error(ErrorCode::kInvalidArgument, "--quantization must be none or fp8, got '" + d.quantization + "'");
  }
  if (d.quantization == "fp8" && d.load_format != "dummy") {
    return make_error(ErrorCode::kInvalidArgument,
                      "--quantization fp8 applies to --load-format dummy only (a checkpoint's format comes from its config.json)");
  }
  if (d.device == "cuda" && !built_with_cuda()) {
    return make_error(ErrorCode::kUnsupported, "--device cuda: this strata binary was built without CUDA (configure with -DSTRATA_CUDA=ON)");
  }
  if (d.device != "auto") return d.device;
#ifdef STRATA_WITH_CUDA
  if (cuda::cuda_device_present()) return std::string("cuda");
#endif
  return std::string("cpu");
}

}  // namespace

Result<EngineModel> load_engine_model(const DeviceArgs& d, const std::string& dir, ThreadPool& pool, EngineOptions* eo) {
  auto device = resolve_device(d);
  if (!device.ok()) return device.error();
  eo->async_scheduling = !d.no_async_scheduling;
  EngineModel out;
  out.device = *device;
  if (out.device == "cpu") {
    if (d.load_format == "dummy") {
      return make_error(ErrorCode::kUnsupported, "--load-format dummy needs --device cuda (the CPU engine loads the checkpoint)");
    }
    if (d.gpu_memory_fraction) log::warn("--gpu-memory-fraction has no effect on --device cpu");
    if (d.deterministic) log::info("--deterministic: the cpu engine's kernels are batch-invariant already");
    LoadOptions lo;
    lo.hidden_output = d.embed;
    auto m = load_model(dir, pool, lo);
    if (!m.ok()) return m.error();
    out.model = std::move(m).value();
    out.identity.model_dir = dir;
    out.identity.backend = backend_numeric_identity(out.device, eo->kv_codecs, d.deterministic);
    return out;
  }
#ifdef STRATA_WITH_CUDA
  if (d.embed) {
    return make_error(ErrorCode::kUnsupported,
                      "--task embed runs on --device cpu only (the GPU executor's head writes logits); add --device cpu");
  }
  auto cfg = load_model_config(dir);
  if (!cfg.ok()) return cfg.error();
  STRATA_RETURN_IF_ERROR(cuda::check_cuda_engine_support(*cfg, eo->kv_codecs));
  cuda::CudaEngineOptions co;
  static_cast<KvLimits&>(co) = *eo;
  const CLI::Option* kv_opt = d.cmd != nullptr ? d.cmd->get_option_no_throw("--kv-cache-bytes") : nullptr;
  const bool kv_explicit = kv_opt != nullptr && kv_opt->count() > 0;
  if (d.gpu_memory_fraction || !kv_explicit) {
    co.gpu_memory_fraction = d.gpu_memory_fraction.value_or(0.9);
    co.kv_cache_bytes = 0;
  }
  co.random_weights = d.load_format == "dummy";
  co.random_fp8 = d.quantization == "fp8";
  co.deterministic = d.deterministic;
  co.kv_codecs = eo->kv_codecs;
  co.kv_tiers = eo->kv_host_bytes > 0 || !eo->kv_disk_dir.empty() || !eo->kv_redis_url.empty();
  co.num_draft_tokens = eo->speculative.method != "off" ? eo->speculative.num_draft_tokens : 0;
  auto parts = cuda::make_cuda_engine_parts(dir, co);
  if (!parts.ok()) return parts.error();
  eo->kv_codecs = parts->kv_codecs;
  eo->kv_blocks = parts->executor->n_kv_blocks();
  eo->kv_quant_blocks = parts->executor->n_kv_quant_blocks();
  out.model = std::move(parts->shape);
  out.executor = std::move(parts->executor);
  out.identity.model_dir = dir;
  out.identity.backend = backend_numeric_identity(out.device, eo->kv_codecs, d.deterministic);
  // FP8 kernels (activations quantized in the GEMMs) compute other numbers than the same
  // weights dequantized.
  if (parts->fp8_weights) out.identity.backend += ";weights=fp8";
  out.identity.dummy_weights = co.random_weights;
  out.identity.dummy_seed = co.seed;
  out.identity.dummy_scale = co.random_scale;
  return out;
#else
  return make_error(ErrorCode::kInternal, "unreachable: cuda device without CUDA");
#endif
}

Result<bool> resolve_embed_task(const std::string& task, const std::string& dir, PoolingConfig* pooling) {
  if (task != "auto" && task != "generate" && task != "embed") {
    return make_error(ErrorCode::kInvalidArgument, "--task must be auto, generate or embed, got '" + task + "'");
  }
  if (task == "generate") return false;
  auto p = load_pooling_config(dir);
  if (!p.ok()) return p.error();
  if (!p->present) {
    if (task == "auto") return false;
    p->present = true;  // a decoder embedding model without sentence-transformers modules
    p->normalize = true;
  }
  *pooling = std::move(p).value();
  return true;
}

std::string state_identity_for(const EngineModel& m, const EngineOptions& eo) {
  StateIdentitySource s = m.identity;
  const bool checkpoints = eo.checkpoint_every > 0 && !eo.checkpoint_dir.empty();
  // A shared tier's blocks outlive this process too, and other processes read them.
  s.persistent = !eo.kv_disk_dir.empty() || checkpoints || !eo.kv_redis_url.empty();
  s.hash_cache_dir = !eo.kv_disk_dir.empty() ? eo.kv_disk_dir : checkpoints ? eo.checkpoint_dir : std::string();
  return state_identity(s);
}

}  // namespace strata::cli
