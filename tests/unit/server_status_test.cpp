// GET /status's JSON from the engine's statistics, and the page at / being self-contained.
#include <gtest/gtest.h>

#include "server/status_page.h"

namespace strata::server {
namespace {

TEST(StatusPage, StatusJsonFromEngineStats) {
  EngineStats e;
  e.alive = true;
  e.running = 2;
  e.waiting = 1;
  e.queue_depth = 3;
  e.kv = {100, 10, 80, 10, 2, 5};
  e.ttft.add(20.0);
  e.ttft.add(40.0);
  e.inter_token.add(5.0);
  e.generated_tokens = 7;
  const StatusInfo info{"m", "cpu", 2048, 16, 4096};
  nlohmann::json j = status_json(info, e);
  EXPECT_EQ(j["model"], "m");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_EQ(j["requests"], nlohmann::json({{"running", 2}, {"waiting", 1}, {"queued", 3}}));
  EXPECT_EQ(j["kv"]["blocks"], 100);
  EXPECT_EQ(j["kv"]["used"], 10);
  EXPECT_EQ(j["kv"]["cached"], 10);
  EXPECT_EQ(j["kv"]["block_size"], 16);
  EXPECT_TRUE(j["kv_tiers"].is_null());
  EXPECT_TRUE(j["kv_window"].is_null());
  EXPECT_EQ(j["ttft"]["count"], 2);
  EXPECT_DOUBLE_EQ(j["ttft"]["sum_ms"].get<double>(), 60.0);
  EXPECT_EQ(j["inter_token"]["count"], 1);
  EXPECT_EQ(j["tokens"]["generated"], 7);
  e.kv_tiers.enabled = true;
  e.kv_tiers.host_blocks = 4;
  e.kv_tiers.disk.blocks = 9;
  j = status_json(info, e);
  EXPECT_EQ(j["kv_tiers"]["host_blocks"], 4);
  EXPECT_EQ(j["kv_tiers"]["disk_blocks"], 9);
}

TEST(StatusPage, PageIsSelfContainedAndCallsTheApiWithTheKey) {
  const std::string& html = status_page_html();
  EXPECT_EQ(html.rfind("<!doctype html>", 0), 0u);
  for (const char* id : {"id=\"key\"", "id=\"status\"", "id=\"prompt\"", "id=\"send\"", "id=\"log\""}) {
    EXPECT_NE(html.find(id), std::string::npos) << id;
  }
  EXPECT_NE(html.find("fetch('/status'"), std::string::npos);
  EXPECT_NE(html.find("fetch('/v1/chat/completions'"), std::string::npos);
  EXPECT_NE(html.find("'Bearer ' + key"), std::string::npos);
  // Nothing loaded from elsewhere, nothing kept in the browser, no HTML built from text.
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("localStorage"), std::string::npos);
  EXPECT_EQ(html.find("innerHTML"), std::string::npos);
}

}  // namespace
}  // namespace strata::server
