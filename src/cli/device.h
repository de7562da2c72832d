// --device, --gpu-memory-fraction, --load-format and --deterministic: where the engine runs. `cpu` is the host
// ModelRunner over the checkpoint; `cuda` (only in a build with STRATA_CUDA) runs the steps on
// the GPU through runtime/cuda/cuda_executor.h; `auto` picks cuda when the build has it and a
// GPU is present.
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/state_identity.h"
#include "model/pooling.h"

namespace strata::cli {

struct DeviceArgs {
  std::string device = "auto";              // auto, cpu or cuda
  std::optional<double> gpu_memory_fraction;  // of total device memory for weights + scratch + KV
  std::string load_format = "auto";         // auto (the checkpoint) or dummy (random weights)
  bool deterministic = false;               // batch-invariant kernels (cuda; the cpu engine always is)
  bool no_async_scheduling = false;         // steps one at a time (EngineOptions::async_scheduling off)
  bool embed = false;                       // load as a pooling model (--task embed; cpu only so far)
  std::string quantization;                 // --quantization: dummy weights' format ("" or none: bf16; fp8)
  const CLI::App* cmd = nullptr;            // to tell an explicit --kv-cache-bytes from its default
};

void add_device_flags(CLI::App* cmd, DeviceArgs& a);

// The model the engine runs: a host model, or on cuda the device executor and a shape-only
// model (Engine::create with an executor).
struct EngineModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<StepExecutor> executor;  // null: the host ModelRunner
  std::string device;                      // "cpu" or "cuda"
  StateIdentitySource identity;            // backend and weights; state_identity_for() adds the rest
};

// Resolves --device and loads the model for it. On cuda the KV pool is sized from
// --kv-cache-bytes when given, else --gpu-memory-fraction (default 0.9), and eo->kv_codecs
// becomes bf16 (after refusing any other codec); eo->kv_blocks is the device pool.
Result<EngineModel> load_engine_model(const DeviceArgs& d, const std::string& dir, ThreadPool& pool, EngineOptions* eo);

// --task auto|generate|embed of `dir`: whether it is served for embeddings, and its pooling
// config (auto: embed when DIR/modules.json has a Pooling module; embed without one:
// last-token pooling, normalized).
Result<bool> resolve_embed_task(const std::string& task, const std::string& dir, PoolingConfig* pooling);

// EngineOptions::model_identity for `m` (engine/state_identity.h): the weights
// are hashed when eo keeps state past the process (a disk tier, checkpoints), with the hash
// cache in the disk tier's directory, else the checkpoint directory.
std::string state_identity_for(const EngineModel& m, const EngineOptions& eo);

// Whether this binary was built with the CUDA backend.
bool built_with_cuda();

}  // namespace strata::cli
