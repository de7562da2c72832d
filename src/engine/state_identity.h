// The state identity: what EngineOptions::model_identity holds, so that the prefix namespace,
// the disk tier's files and the checkpoints built on it name everything that decides the KV's
// numbers besides the shape, codecs and block layout the engine adds itself: the weights'
// content, config.json's content, quantization and adapters, and the backend's arithmetic.
#pragma once

#include <cstdint>
#include <string>

#include "kv/codec/kv_codec_config.h"

namespace strata {

struct StateIdentitySource {
  std::string model_dir;
  // backend_numeric_identity(): KV computed by another backend is other numbers.
  std::string backend;
  // --load-format dummy: random weights drawn from this seed and scale, config.json's shape.
  bool dummy_weights = false;
  uint64_t dummy_seed = 0;
  float dummy_scale = 0.0f;
  // The KV or checkpoints outlive this process (a disk tier, a checkpoint directory): the
  // weights are hashed. Otherwise the state dies with the weights this process loaded and the
  // model's absolute path names them well enough; hashing a large model only to salt an
  // in-memory cache would cost a full read of its files at every start.
  bool persistent = false;
  std::string hash_cache_dir;  // where the weight hash cache lives (empty: no cache)
};

// "cpu:f32" on the CPU (its kernels compute in f32 and are batch-invariant always, so
// --deterministic changes nothing); on cuda the KV row type the pool holds for the default codec
// (resolved_codecs: the device's, where auto left unresolved means the f32 rows of split f32/f16
// checkpoints) and whether the kernels are the batch-invariant ones.
std::string backend_numeric_identity(const std::string& device, const KvCodecConfig& resolved_codecs, bool deterministic);

// The identity string (see StateIdentitySource). Never fails: when the weights cannot be hashed
// it logs why and returns an identity no other process can produce, so persisted state is
// served cold instead of being trusted.
std::string state_identity(const StateIdentitySource& source);

}  // namespace strata
