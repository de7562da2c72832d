// `strata serve --supervise`: crash isolation. This process owns the listening port and the
// client connections; the engine runs in a child process (`strata serve --supervised-child` on
// a loopback port it prints). Every request is relayed to the child. When the child dies
// (kill -9, a device fault, an engine loop that stopped), it is restarted (with backoff, at
// most max_restarts_per_minute) and each request in flight is sent again with the same body:
// a generation resumes from its checkpoint and a streamed answer continues where its client's
// copy ends, with no token missing or repeated.
//
// How a stream is kept exact: the supervisor asks the child for stream parts (kStreamPartsHeader).
// The child then assembles every token on its own and follows its SSE text with a comment line
// naming the part: ": strata-part start", ": strata-part token N" (N counts generated tokens),
// ": strata-part end" (after the closing events) or ": strata-part lost" (the engine died).
// The text of part N depends only on tokens 1..N, so a resumed request reproduces the parts;
// the supervisor forwards a part once, strips the markers, and skips parts <= the last one it
// delivered. It pins what would otherwise differ between the attempts: the seed of a request
// without one (kSeedHeader: a random seed drawn once, so the output distribution is unchanged),
// the response id and created time.
//
// /health answers here: 200 with the restart count while the child serves, 503 with the reason
// while it is down. /metrics is the child's plus strata_supervisor_* lines. SIGINT/SIGTERM stop
// the child gracefully (it flushes its KV writer), then this process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "server/http_listener.h"

namespace strata::server {

// Request headers a supervised child honors (HttpOptions::supervised) and one it answers with.
inline constexpr const char* kSeedHeader = "X-Strata-Seed";                // decimal u64
inline constexpr const char* kResponseIdHeader = "X-Strata-Response-Id";  // chatcmpl-..., msg_...
inline constexpr const char* kCreatedHeader = "X-Strata-Created";          // unix seconds
inline constexpr const char* kStreamPartsHeader = "X-Strata-Stream-Parts";  // "1": part markers
inline constexpr const char* kEngineDownHeader = "X-Strata-Engine-Down";    // answer: the engine died
inline constexpr const char* kPartPrefix = ": strata-part ";
// The per-start secret that authenticates the supervisor to its child: the child reads it from
// its environment (kSupervisorSecretEnv) and honors the headers above only when a request
// carries it in kSupervisorSecretHeader. Anyone else who reaches the child's loopback port
// is an ordinary client.
inline constexpr const char* kSupervisorSecretHeader = "X-Strata-Supervisor";
inline constexpr const char* kSupervisorSecretEnv = "STRATA_SUPERVISOR_SECRET";

// The supervisor's side of a parted stream: fed the child's bytes attempt after attempt, it
// emits each part's SSE text once, in order, without the markers.
class PartFilter {
 public:
  using Emit = std::function<void(const std::string&)>;
  // A new attempt (the same request re-sent): its replayed parts are skipped.
  void begin_attempt();
  // Feeds bytes of the child's answer; emit gets the text to forward (never empty).
  void feed(const char* data, size_t n, const Emit& emit);
  bool ended() const { return ended_; }  // the "end" part was forwarded
  bool lost() const { return lost_; }    // the child said its engine died
  int64_t delivered() const { return delivered_; }  // tokens whose text was forwarded

 private:
  void on_part(const std::string& label, const Emit& emit);

  std::string buffer_;   // bytes of an incomplete SSE block
  std::string pending_;  // complete blocks of the part not yet labeled
  bool start_sent_ = false;
  int64_t delivered_ = 0;
  bool ended_ = false;
  bool lost_ = false;
};

struct SupervisorOptions {
  std::vector<std::string> child_argv;  // the child's full command line, executable first
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  std::string api_key;  // "": no authentication (the child checks it too)
  size_t max_body_bytes = size_t(32) << 20;
  int http_threads = 72;
  ListenerLimits listener;  // http_listener.h; workers and the body limit come from the two above
  int max_restarts_per_minute = 5;  // past it the supervisor gives up and exits
  double stop_timeout_s = 40.0;     // SIGTERM to the child, then SIGKILL after this long
  std::string temp_dir;             // removed at exit ("" none): the default checkpoint dir
};

// Serves until SIGINT/SIGTERM; returns the exit status. A child that fails before it first
// listens (a bad flag, a model that cannot load) ends the supervisor with the child's status.
int run_supervisor(const SupervisorOptions& options);

// The child's command line from the supervisor's own (argv[0] first): --supervise, --host and
// --port (either spelling, `--port 1` or `--port=1`) are dropped, the executable becomes
// `executable`, and `--host 127.0.0.1 --port 0 --supervised-child` plus extra are appended.
std::vector<std::string> child_command_line(const std::vector<std::string>& own, const std::string& executable,
                                            const std::vector<std::string>& extra);
// This process's command line (/proc/self/cmdline).
std::vector<std::string> own_command_line();

}  // namespace strata::server
