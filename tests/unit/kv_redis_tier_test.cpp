// The Redis KV tier against a real redis-server this test starts on a free loopback port:
// URL parsing, the block format's checks, pipelined writes, lookups and reads, a foreign
// identity, Redis going away and coming back, and the errors of a wrong password or port.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "kv/redis/redis_client.h"
#include "kv/redis/redis_tier.h"

namespace strata {
namespace {

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool have_redis_server() { return std::system("command -v redis-server >/dev/null 2>&1") == 0; }

// A redis-server child on `port`, without persistence.
class RedisServer {
 public:
  RedisServer(int port, std::string password = "") : port_(port), password_(std::move(password)) { start(); }
  ~RedisServer() { stop(); }
  void start() {
    pid_ = ::fork();
    if (pid_ == 0) {
      const std::string p = std::to_string(port_);
      std::vector<const char*> argv = {"redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--save", "",
                                       "--appendonly", "no", "--loglevel", "warning"};
      if (!password_.empty()) {
        argv.push_back("--requirepass");
        argv.push_back(password_.c_str());
      }
      argv.push_back(nullptr);
      const int null_fd = ::open("/dev/null", O_WRONLY);
      ::dup2(null_fd, 1);
      ::dup2(null_fd, 2);
      ::execvp("redis-server", const_cast<char* const*>(argv.data()));
      ::_exit(127);
    }
    RedisUrl u;
    u.port = port_;
    u.password = password_;
    for (int i = 0; i < 200; ++i) {  // up to 10 s
      RedisClient c(u, 0.5);
      if (c.connect().ok()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "redis-server did not start on port " << port_;
  }
  void pause() { ::kill(pid_, SIGSTOP); }  // connections hang: commands time out
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  int port_;
  std::string password_;
  pid_t pid_ = -1;
};

RedisTierOptions options(int port, const std::string& identity, int64_t block_bytes = 1024) {
  RedisTierOptions o;
  o.url.port = port;
  o.identity = identity;
  o.block_bytes = block_bytes;
  o.queue_bytes = int64_t(1) << 20;
  o.key_prefix = "test:kv:";
  o.timeout_s = 0.5;
  return o;
}

std::vector<uint8_t> block(uint64_t seed, size_t n = 1024) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = uint8_t((seed * 131 + i * 7) & 0xff);
  return b;
}

TEST(RedisUrl, ParsesHostPortPasswordAndDb) {
  auto u = parse_redis_url("redis://:s3cret@10.1.2.3:7000/4");
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_EQ(u->host, "10.1.2.3");
  EXPECT_EQ(u->port, 7000);
  EXPECT_EQ(u->password, "s3cret");
  EXPECT_EQ(u->user, "");
  EXPECT_EQ(u->db, 4);
  EXPECT_EQ(u->display(), "redis://:***@10.1.2.3:7000/4");
  auto d = parse_redis_url("redis://cache");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->host, "cache");
  EXPECT_EQ(d->port, 6379);
  EXPECT_EQ(d->db, 0);
  auto acl = parse_redis_url("redis://strata:pw@[::1]:6380");
  ASSERT_TRUE(acl.ok()) << acl.error().message;
  EXPECT_EQ(acl->host, "::1");
  EXPECT_EQ(acl->user, "strata");
  EXPECT_EQ(acl->port, 6380);
}

TEST(RedisUrl, RejectsWhatItCannotUseNamingTheValue) {
  auto scheme = parse_redis_url("http://host:6379");
  ASSERT_FALSE(scheme.ok());
  EXPECT_NE(scheme.error().message.find("not a redis:// URL"), std::string::npos);
  auto tls = parse_redis_url("rediss://host:6379");
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.error().message.find("TLS"), std::string::npos);
  auto port = parse_redis_url("redis://host:99999/0");
  ASSERT_FALSE(port.ok());
  EXPECT_NE(port.error().message.find("'99999'"), std::string::npos);
  auto db = parse_redis_url("redis://:pw@host:6379/x");
  ASSERT_FALSE(db.ok());
  EXPECT_NE(db.error().message.find("'x'"), std::string::npos);
  EXPECT_EQ(db.error().message.find("pw@"), std::string::npos) << "the password is masked: " << db.error().message;
}

class RedisTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)";
    port_ = free_port();
    server_ = std::make_unique<RedisServer>(port_);
  }
  int port_ = 0;
  std::unique_ptr<RedisServer> server_;
};

TEST_F(RedisTierTest, WritesThenFindsAndReadsBlocksInChainOrder) {
  auto t = RedisTier::open(options(port_, "model-a"));
  ASSERT_TRUE(t.ok()) << t.error().message;
  RedisTier& tier = **t;
  const std::vector<uint64_t> hashes = {11, 22, 33, 44};
  for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(tier.enqueue(hashes[i], block(hashes[i]).data()));
  ASSERT_TRUE(tier.flush(5.0));
  EXPECT_EQ(tier.stats().written_blocks, 3);
  EXPECT_EQ(tier.count_prefix(hashes), 3);  // 44 was never written: the chain ends there
  // A second process (another replica) of the same identity finds and reads them.
  auto other = RedisTier::open(options(port_, "model-a"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ((*other)->count_prefix(hashes), 3);
  std::vector<std::vector<uint8_t>> out(3, std::vector<uint8_t>(1024));
  std::vector<uint8_t*> outs = {out[0].data(), out[1].data(), out[2].data()};
  std::vector<uint8_t> ok;
  (*other)->read_many(std::span<const uint64_t>(hashes).first(3), outs, ok);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(ok[i]);
    EXPECT_EQ(out[i], block(hashes[i])) << i;
  }
  EXPECT_EQ((*other)->stats().read_blocks, 3);
  EXPECT_TRUE((*other)->known(22));
  // Another identity (other weights or codec) never sees them.
  auto foreign = RedisTier::open(options(port_, "model-b"));
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ((*foreign)->count_prefix(hashes), 0);
}

TEST_F(RedisTierTest, RejectsCorruptTruncatedAndForeignValues) {
  auto t = RedisTier::open(options(port_, "model-a"));
  ASSERT_TRUE(t.ok());
  RedisTier& tier = **t;
  const auto b = block(5);
  std::string v = tier.encode(5, b.data());
  std::vector<uint8_t> out(1024);
  EXPECT_EQ(tier.decode(v, 5, out.data()), "");
  EXPECT_EQ(out, b);
  std::string flipped = v;
  flipped[100] ^= 1;
  EXPECT_EQ(tier.decode(flipped, 5, out.data()), "checksum mismatch");
  EXPECT_NE(tier.decode(std::string_view(v).substr(0, v.size() - 1), 5, out.data()).find("size"), std::string::npos);
  EXPECT_EQ(tier.decode(v, 6, out.data()), "another block hash");
  auto foreign = RedisTier::open(options(port_, "model-b"));
  ASSERT_TRUE(foreign.ok());
  EXPECT_EQ((*foreign)->decode(v, 5, out.data()), "another state identity");

  // A value corrupted in Redis is a miss, counted.
  RedisUrl u;
  u.port = port_;
  RedisClient c(u, 0.5);
  ASSERT_TRUE(c.connect().ok());
  ASSERT_TRUE(c.pipeline({{"SET", tier.key(5), flipped}}).ok());
  const uint64_t h = 5;
  uint8_t* o = out.data();
  std::vector<uint8_t> ok;
  tier.read_many(std::span<const uint64_t>(&h, 1), std::span<uint8_t* const>(&o, 1), ok);
  EXPECT_FALSE(ok[0]);
  EXPECT_EQ(tier.stats().corrupt_blocks, 1);
  EXPECT_FALSE(tier.known(5));
}

TEST_F(RedisTierTest, DropsPastTheQueueCap) {
  RedisTierOptions o = options(port_, "model-a");
  o.queue_bytes = 3 * 1100;  // three encoded blocks of 1 KiB + header
  auto t = RedisTier::open(o);
  ASSERT_TRUE(t.ok());
  server_->pause();  // the writer's write hangs until its timeout: the queue fills meanwhile
  int dropped = 0;
  for (uint64_t h = 1; h <= 20; ++h) dropped += (*t)->enqueue(h, block(h).data()) ? 0 : 1;
  EXPECT_GT(dropped, 0);
  EXPECT_EQ((*t)->stats().dropped_blocks, dropped);
}

TEST_F(RedisTierTest, RedisDownIsAMissThenItComesBack) {
  auto t = RedisTier::open(options(port_, "model-a"));
  ASSERT_TRUE(t.ok());
  RedisTier& tier = **t;
  const uint64_t h = 77;
  ASSERT_TRUE(tier.enqueue(h, block(h).data()));
  ASSERT_TRUE(tier.flush(5.0));
  server_->stop();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(tier.count_prefix(std::span<const uint64_t>(&h, 1)), 0);
  EXPECT_EQ(tier.count_prefix(std::span<const uint64_t>(&h, 1)), 0);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0) << "fails fast";
  EXPECT_EQ(tier.stats().lookup_errors, 2);
  ASSERT_TRUE(tier.enqueue(99, block(99).data()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_GE(tier.stats().write_errors, 1);
  EXPECT_FALSE(tier.stats().connected);
  EXPECT_FALSE(tier.flush(5.0)) << "nothing to wait for while Redis is down";
  EXPECT_GT(tier.stats().queued_bytes, 0) << "the block waits in the queue";

  server_->start();  // empty: no persistence
  for (int i = 0; i < 200 && tier.stats().written_blocks < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(tier.stats().written_blocks, 2) << "the queued block is written once Redis is back";
  EXPECT_TRUE(tier.stats().connected);
  EXPECT_TRUE(tier.flush(5.0));
  const uint64_t h99 = 99;
  EXPECT_EQ(tier.count_prefix(std::span<const uint64_t>(&h99, 1)), 1);
  EXPECT_GE(tier.stats().reconnects, 1);
}

TEST(RedisTierOpen, WrongPasswordAndUnreachablePortAreClearErrors) {
  if (!have_redis_server()) GTEST_SKIP() << "redis-server is not installed";
  const int port = free_port();
  RedisServer server(port, "right");
  RedisTierOptions o = options(port, "m");
  o.url.password = "wrong";
  auto bad = RedisTier::open(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("AUTH failed"), std::string::npos) << bad.error().message;
  EXPECT_EQ(bad.error().message.find("wrong"), std::string::npos) << "the password is not shown";
  o.url.password = "";
  auto none = RedisTier::open(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().message.find("NOAUTH"), std::string::npos) << none.error().message;
  o.url.password = "right";
  EXPECT_TRUE(RedisTier::open(o).ok());
  RedisTierOptions closed = options(free_port(), "m");
  auto refused = RedisTier::open(closed);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("cannot connect"), std::string::npos) << refused.error().message;
}

}  // namespace
}  // namespace strata
