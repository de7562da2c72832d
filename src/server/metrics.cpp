#include "server/metrics.h"

#include <cmath>
#include <sstream>

namespace strata::server {

void ServerMetrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> l(mu_);
  ++s_.requests[{endpoint, status}];
}

void ServerMetrics::count_usage(const Usage& u) {
  std::lock_guard<std::mutex> l(mu_);
  s_.prompt_tokens += u.prompt_tokens;
  s_.completion_tokens += u.completion_tokens;
  s_.cached_tokens += u.cached_tokens;
}

ServerMetrics::Snapshot ServerMetrics::snapshot() const {
  std::lock_guard<std::mutex> l(mu_);
  Snapshot s = s_;
  s.disconnects = disconnects_;
  return s;
}

namespace {

std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

void header(std::ostringstream& os, const char* name, const char* type, const char* help) {
  os << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

// Engine histograms count milliseconds; Prometheus convention is seconds.
void histogram(std::ostringstream& os, const char* name, const char* help, const LatencyHistogram& h, const std::string& labels) {
  header(os, name, "histogram", help);
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds_ms.size(); ++i) {
    cumulative += i < h.counts.size() ? h.counts[i] : 0;
    os << name << "_bucket{" << labels << ",le=\"" << num(h.bounds_ms[i] / 1000.0) << "\"} " << cumulative << '\n';
  }
  os << name << "_bucket{" << labels << ",le=\"+Inf\"} " << h.count << '\n';
  os << name << "_sum{" << labels << "} " << num(h.sum_ms / 1000.0) << '\n';
  os << name << "_count{" << labels << "} " << h.count << '\n';
}

}  // namespace

std::string render_metrics(const ServerMetrics::Snapshot& s, const EngineStats& e, const std::string& model_name) {
  std::ostringstream os;
  const std::string m = "model_name=\"" + model_name + "\"";
  header(os, "strata_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, n] : s.requests) {
    os << "strata_requests_total{" << m << ",endpoint=\"" << key.first << "\",status=\"" << key.second << "\"} " << n << '\n';
  }
  header(os, "strata_requests_finished_total", "counter", "Generation requests the engine finished, by reason.");
  for (int r = 0; r < kNumFinishReasons; ++r) {
    os << "strata_requests_finished_total{" << m << ",reason=\"" << finish_reason_name(FinishReason(r)) << "\"} " << e.finished[r] << '\n';
  }
  header(os, "strata_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  os << "strata_prompt_tokens_total{" << m << "} " << s.prompt_tokens << '\n';
  header(os, "strata_generation_tokens_total", "counter", "Generated tokens of finished requests.");
  os << "strata_generation_tokens_total{" << m << "} " << s.completion_tokens << '\n';
  header(os, "strata_cached_prompt_tokens_total", "counter", "Prompt tokens served by the prefix cache.");
  os << "strata_cached_prompt_tokens_total{" << m << "} " << s.cached_tokens << '\n';
  header(os, "strata_prefix_cache_hit_rate", "gauge", "Cached prompt tokens over prompt tokens, since start.");
  os << "strata_prefix_cache_hit_rate{" << m << "} " << num(s.prompt_tokens > 0 ? double(s.cached_tokens) / double(s.prompt_tokens) : 0.0) << '\n';
  header(os, "strata_client_disconnects_total", "counter", "Requests cancelled because the client went away.");
  os << "strata_client_disconnects_total{" << m << "} " << s.disconnects << '\n';
  header(os, "strata_http_rejected_connections_total", "counter",
         "Connections answered before a worker read them (408, 413, 431, 429, 400; http_listener.h).");
  os << "strata_http_rejected_connections_total{" << m << "} " << s.rejected_connections << '\n';
  header(os, "strata_engine_alive", "gauge", "1 while the engine loop runs.");
  os << "strata_engine_alive{" << m << "} " << (e.alive ? 1 : 0) << '\n';
  header(os, "strata_queue_depth", "gauge", "Requests submitted and not yet admitted.");
  os << "strata_queue_depth{" << m << "} " << e.queue_depth << '\n';
  header(os, "strata_num_requests_running", "gauge", "Sequences holding KV blocks.");
  os << "strata_num_requests_running{" << m << "} " << e.running << '\n';
  header(os, "strata_num_requests_waiting", "gauge", "Sequences waiting in the scheduler (preempted ones included).");
  os << "strata_num_requests_waiting{" << m << "} " << e.waiting << '\n';
  header(os, "strata_kv_blocks", "gauge", "KV blocks by state: used (referenced), cached (idle, reusable), free, pinned (cached under a session).");
  os << "strata_kv_blocks{" << m << ",state=\"used\"} " << e.kv.used << '\n';
  os << "strata_kv_blocks{" << m << ",state=\"cached\"} " << e.kv.cached << '\n';
  os << "strata_kv_blocks{" << m << ",state=\"free\"} " << e.kv.free << '\n';
  os << "strata_kv_blocks{" << m << ",state=\"pinned\"} " << e.kv.pinned << '\n';
  header(os, "strata_kv_blocks_total", "gauge", "KV blocks in the pool.");
  os << "strata_kv_blocks_total{" << m << "} " << e.kv.n_blocks << '\n';
  header(os, "strata_kv_evictions_total", "counter", "Cached KV blocks given to another use.");
  os << "strata_kv_evictions_total{" << m << "} " << e.kv.evictions << '\n';
  if (e.kv_tiers.enabled) {
    const KvTierStats& t = e.kv_tiers;
    header(os, "strata_kv_tier_blocks", "gauge", "KV blocks held by the lower tiers (host memory, disk).");
    os << "strata_kv_tier_blocks{" << m << ",tier=\"host\"} " << t.host_blocks << '\n';
    os << "strata_kv_tier_blocks{" << m << ",tier=\"disk\"} " << t.disk.blocks << '\n';
    header(os, "strata_kv_tier_bytes", "gauge", "Bytes held by the lower KV tiers.");
    os << "strata_kv_tier_bytes{" << m << ",tier=\"host\"} " << t.host_bytes << '\n';
    os << "strata_kv_tier_bytes{" << m << ",tier=\"disk\"} " << t.disk.bytes << '\n';
    header(os, "strata_kv_tier_hit_blocks_total", "counter", "KV blocks a prefix lookup promoted from a lower tier.");
    os << "strata_kv_tier_hit_blocks_total{" << m << ",tier=\"host\"} " << t.host_hit_blocks << '\n';
    os << "strata_kv_tier_hit_blocks_total{" << m << ",tier=\"disk\"} " << t.disk_hit_blocks << '\n';
    if (t.redis.enabled) os << "strata_kv_tier_hit_blocks_total{" << m << ",tier=\"redis\"} " << t.redis_hit_blocks << '\n';
    header(os, "strata_kv_tier_demoted_blocks_total", "counter", "KV blocks the device pool evicted into the lower tiers.");
    os << "strata_kv_tier_demoted_blocks_total{" << m << "} " << t.demoted_blocks << '\n';
    header(os, "strata_kv_disk_written_blocks_total", "counter", "KV blocks the disk writer wrote.");
    os << "strata_kv_disk_written_blocks_total{" << m << "} " << t.disk.written_blocks << '\n';
    header(os, "strata_kv_disk_dropped_blocks_total", "counter", "KV blocks dropped because the disk writer queue was full.");
    os << "strata_kv_disk_dropped_blocks_total{" << m << "} " << t.disk.dropped_blocks << '\n';
    header(os, "strata_kv_disk_queued_bytes", "gauge", "Bytes waiting in the disk writer queue.");
    os << "strata_kv_disk_queued_bytes{" << m << "} " << t.disk.queued_bytes << '\n';
    header(os, "strata_kv_disk_evicted_files_total", "counter", "Disk tier files deleted to keep the byte budget.");
    os << "strata_kv_disk_evicted_files_total{" << m << "} " << t.disk.evicted_files << '\n';
    header(os, "strata_kv_disk_quarantined_files_total", "counter", "Corrupt, truncated or foreign disk tier files moved to quarantine/.");
    os << "strata_kv_disk_quarantined_files_total{" << m << "} " << t.disk.quarantined_files << '\n';
    if (t.redis.enabled) {
      const RedisTierStats& r = t.redis;
      header(os, "strata_kv_redis_connected", "gauge", "1 while the Redis KV tier's writer is connected.");
      os << "strata_kv_redis_connected{" << m << "} " << (r.connected ? 1 : 0) << '\n';
      header(os, "strata_kv_redis_blocks_total", "counter",
             "Redis KV tier blocks by outcome: written, dropped (writer queue full), write_error (Redis down), "
             "found (by lookups), read (verified), missing (gone before the read), corrupt (failed verification).");
      const std::pair<const char*, int64_t> rb[] = {{"written", r.written_blocks},  {"dropped", r.dropped_blocks},
                                                    {"write_error", r.write_errors}, {"found", r.lookup_blocks},
                                                    {"read", r.read_blocks},         {"missing", r.missing_blocks},
                                                    {"corrupt", r.corrupt_blocks}};
      for (const auto& [what, n] : rb) os << "strata_kv_redis_blocks_total{" << m << ",result=\"" << what << "\"} " << n << '\n';
      header(os, "strata_kv_redis_lookups_total", "counter", "Redis KV tier prefix lookups; error: Redis was unreachable (a miss).");
      os << "strata_kv_redis_lookups_total{" << m << ",result=\"ok\"} " << (r.lookups - r.lookup_errors) << '\n';
      os << "strata_kv_redis_lookups_total{" << m << ",result=\"error\"} " << r.lookup_errors << '\n';
      header(os, "strata_kv_redis_read_errors_total", "counter", "Redis KV tier block reads that failed (Redis unreachable).");
      os << "strata_kv_redis_read_errors_total{" << m << "} " << r.read_errors << '\n';
      header(os, "strata_kv_redis_queued_bytes", "gauge", "Bytes waiting in the Redis KV tier's writer queue.");
      os << "strata_kv_redis_queued_bytes{" << m << "} " << r.queued_bytes << '\n';
      header(os, "strata_kv_redis_reconnects_total", "counter", "Times the Redis KV tier's writer reconnected.");
      os << "strata_kv_redis_reconnects_total{" << m << "} " << r.reconnects << '\n';
    }
    // The sliding-window pool's blocks and the recurrent-state snapshots, in tiers of their own.
    const std::pair<const char*, const KvTierStats*> companions[] = {{"window", &e.kv_window_tiers}, {"state", &e.state_tiers}};
    bool any = false;
    for (const auto& [pool, c] : companions) any = any || c->enabled;
    if (any) {
      header(os, "strata_kv_companion_tier_blocks", "gauge",
             "Sliding-window blocks (pool=window) and state snapshots (pool=state) held by the lower tiers.");
      for (const auto& [pool, c] : companions) {
        if (!c->enabled) continue;
        os << "strata_kv_companion_tier_blocks{" << m << ",pool=\"" << pool << "\",tier=\"host\"} " << c->host_blocks << '\n';
        os << "strata_kv_companion_tier_blocks{" << m << ",pool=\"" << pool << "\",tier=\"disk\"} " << c->disk.blocks << '\n';
      }
      header(os, "strata_kv_companion_tier_hit_blocks_total", "counter",
             "Sliding-window blocks and state snapshots a prefix hit brought back from a lower tier.");
      for (const auto& [pool, c] : companions) {
        if (!c->enabled) continue;
        os << "strata_kv_companion_tier_hit_blocks_total{" << m << ",pool=\"" << pool << "\",tier=\"host\"} " << c->host_hit_blocks << '\n';
        os << "strata_kv_companion_tier_hit_blocks_total{" << m << ",pool=\"" << pool << "\",tier=\"disk\"} " << c->disk_hit_blocks << '\n';
      }
      header(os, "strata_kv_companion_tier_demoted_blocks_total", "counter",
             "Sliding-window blocks and state snapshots evicted into the lower tiers.");
      for (const auto& [pool, c] : companions) {
        if (c->enabled) os << "strata_kv_companion_tier_demoted_blocks_total{" << m << ",pool=\"" << pool << "\"} " << c->demoted_blocks << '\n';
      }
    }
  }
  header(os, "strata_engine_steps_total", "counter", "Engine steps (packed forwards).");
  os << "strata_engine_steps_total{" << m << "} " << e.steps << '\n';
  header(os, "strata_engine_overlapped_steps_total", "counter",
         "Steps queued while the previous one ran on the device (overlapped scheduling).");
  os << "strata_engine_overlapped_steps_total{" << m << "} " << e.overlapped_steps << '\n';
  header(os, "strata_engine_prefix_hit_tokens_total", "counter", "Tokens admission took from the prefix cache (recomputations included).");
  os << "strata_engine_prefix_hit_tokens_total{" << m << "} " << e.prefix_hit_tokens << '\n';
  header(os, "strata_checkpoints_foreign_total", "counter",
         "Checkpoints skipped because another state identity (weights, codec, layout, backend) wrote them.");
  os << "strata_checkpoints_foreign_total{" << m << "} " << e.checkpoints_foreign << '\n';
  header(os, "strata_checkpoints_total", "counter",
         "Generation checkpoints by outcome: written, coalesced (replaced in the queue by a newer one of the same "
         "request), dropped (the writer's queue was full), failed (I/O error).");
  const std::pair<const char*, int64_t> ckpt[] = {{"written", e.checkpoints.written}, {"coalesced", e.checkpoints.coalesced},
                                                  {"dropped", e.checkpoints.dropped}, {"failed", e.checkpoints.failed}};
  for (const auto& [what, n] : ckpt) os << "strata_checkpoints_total{" << m << ",result=\"" << what << "\"} " << n << '\n';
  header(os, "strata_checkpoint_max_gap_tokens", "gauge",
         "The most generated tokens between two written checkpoints of one request (its first: since the start).");
  os << "strata_checkpoint_max_gap_tokens{" << m << "} " << e.checkpoints.max_gap_tokens << '\n';
  header(os, "strata_checkpoint_blocks_total", "counter",
         "KV blocks of checkpoints by outcome: staged (read off the pool), handed (taken by the disk tier), dropped "
         "(the disk writer's queue was full), deferred (no staging room: left for the next checkpoint).");
  const std::pair<const char*, int64_t> cb[] = {{"staged", e.checkpoint_blocks.staged},
                                                {"handed", e.checkpoint_blocks.handed},
                                                {"dropped", e.checkpoint_blocks.dropped},
                                                {"deferred", e.checkpoint_blocks.deferred}};
  for (const auto& [what, n] : cb) os << "strata_checkpoint_blocks_total{" << m << ",result=\"" << what << "\"} " << n << '\n';
  header(os, "strata_checkpoint_queue_bytes", "gauge", "Bytes of checkpoints waiting for the writer thread.");
  os << "strata_checkpoint_queue_bytes{" << m << "} " << e.checkpoints.queued_bytes << '\n';
  header(os, "strata_preemptions_total", "counter", "Sequences preempted for lack of KV blocks.");
  os << "strata_preemptions_total{" << m << "} " << e.preemptions << '\n';
  header(os, "strata_spec_draft_tokens_total", "counter", "Drafted tokens the speculative method verified.");
  os << "strata_spec_draft_tokens_total{" << m << "} " << e.spec_draft_tokens << '\n';
  header(os, "strata_spec_accepted_tokens_total", "counter", "Drafted tokens the verifies accepted.");
  os << "strata_spec_accepted_tokens_total{" << m << "} " << e.spec_accepted_tokens << '\n';
  header(os, "strata_spec_accepted_per_verify", "histogram", "Accepted drafts per verify span.");
  {
    int64_t cum = 0, sum = 0;
    for (int i = 0; i <= EngineStats::kMaxSpecHistogram; ++i) {
      cum += e.spec_accepted_hist[i];
      sum += int64_t(i) * e.spec_accepted_hist[i];
      if (i < EngineStats::kMaxSpecHistogram) {
        os << "strata_spec_accepted_per_verify_bucket{" << m << ",le=\"" << i << "\"} " << cum << '\n';
      }
    }
    os << "strata_spec_accepted_per_verify_bucket{" << m << ",le=\"+Inf\"} " << cum << '\n';
    os << "strata_spec_accepted_per_verify_sum{" << m << "} " << sum << '\n';
    os << "strata_spec_accepted_per_verify_count{" << m << "} " << e.spec_verifies << '\n';
  }
  histogram(os, "strata_time_to_first_token_seconds", "Submission to first generated token.", e.ttft, m);
  histogram(os, "strata_inter_token_latency_seconds", "Time between consecutive generated tokens of a request.", e.inter_token, m);
  header(os, "strata_grammar_requests_total", "counter", "Requests admitted with a grammar (structured output).");
  os << "strata_grammar_requests_total{" << m << "} " << e.grammar_requests << '\n';
  header(os, "strata_fill_tokens_total", "counter", "Tokens a grammar forced, appended without sampling (token fill).");
  os << "strata_fill_tokens_total{" << m << "} " << e.fill_tokens << '\n';
  header(os, "strata_fill_spans_total", "counter", "Spans of filled tokens.");
  os << "strata_fill_spans_total{" << m << "} " << e.fill_spans << '\n';
  histogram(os, "strata_grammar_mask_seconds", "Host time of one token's grammar mask.", e.grammar_mask, m);
  return os.str();
}

}  // namespace strata::server
