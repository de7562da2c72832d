// strata router: an HTTP front over strata replicas (router/router.h).
#include <signal.h>

#include <cstdio>
#include <thread>

#include "cli/commands.h"
#include "core/log.h"
#include "router/router.h"

namespace strata::cli {

void register_router(CLI::App& app) {
  auto* cmd = app.add_subcommand("router", "Route OpenAI and Anthropic requests over strata replicas by prefix and session");
  auto o = std::make_shared<router::RouterOptions>();
  cmd->add_option("--replica", o->replicas, "A replica's base URL, http://host:port (repeatable)")->required();
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--health-interval", o->health_interval_s, "Seconds between health checks of each replica")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  cmd->add_option("--max-attempts", o->max_attempts, "Replicas tried per request (a dead one's request goes to the next)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--prefix-bytes", o->prefix_bytes, "Leading prompt bytes that key prefix-aware routing")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--load-slack", o->load_slack,
                  "In-flight requests the prefix's replica may carry over the least loaded one before load wins")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->callback([o] {
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
    router::Router r(*o);
    auto port = r.start();
    if (!port.ok()) {
      log::error("{}", port.error().to_string());
      exit_code() = 2;
      return;
    }
    std::printf("strata router: listening on http://%s:%d\n", o->host.c_str(), *port);
    std::fflush(stdout);
    std::thread waiter([&r, signals] {
      int sig = 0;
      sigwait(&signals, &sig);
      r.stop();
    });
    r.run();
    pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter when the listener stopped by itself
    waiter.join();
  });
}

}  // namespace strata::cli
