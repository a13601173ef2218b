// The TCP buffer limits a worker reads and what it says of them.

#include "worker/app/tcp_limits.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace geo::app {
namespace {

namespace fs = std::filesystem;

class TcpLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("geo-tcp-limits-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
             "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(root_ / "net/ipv4");
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(root_ / "net/ipv4" / name) << text;
  }
  fs::path root_;
};

TEST_F(TcpLimitsTest, ReadsTheThirdFieldOfEach) {
  write("tcp_rmem", "4096\t131072\t6291456\n");
  write("tcp_wmem", "4096 16384 4194304\n");
  auto l = readTcpBufferLimits(root_.string());
  ASSERT_TRUE(l.ok()) << l.status().toString();
  EXPECT_EQ(l->receiveMaxBytes, 6291456);
  EXPECT_EQ(l->sendMaxBytes, 4194304);
  EXPECT_EQ(l->receiveInitialBytes, 131072);
}

TEST(TcpInitialWindow, WarnsWhenTheReceiveBufferCannotAdvertiseIt) {
  // Linux's 128 KiB: about 64 KB of window, under 100 segments (145 KB).
  const auto warning = initialWindowWarning({6 << 20, 4 << 20, 131072}, 100);
  ASSERT_TRUE(warning.has_value());
  for (const char* part : {"tcpInitialWindow = 100 segments (144 KB)", "starts at 128 KiB",
                           "advertises about 65 KB", "at least 512 KiB", "second field"}) {
    EXPECT_NE(warning->find(part), std::string::npos) << part << " not in: " << *warning;
  }
  // 1 MiB holds it; so does 128 KiB for the kernel's own 10 segments; and
  // nothing is said without the setting.
  EXPECT_FALSE(initialWindowWarning({6 << 20, 4 << 20, 1 << 20}, 100).has_value());
  EXPECT_FALSE(initialWindowWarning({6 << 20, 4 << 20, 131072}, 10).has_value());
  EXPECT_FALSE(initialWindowWarning({6 << 20, 4 << 20, 131072}, 0).has_value());
}

TEST_F(TcpLimitsTest, NamesTheFileAndWhatItHeld) {
  write("tcp_rmem", "4096 131072\n");
  write("tcp_wmem", "4096 16384 4194304\n");
  auto l = readTcpBufferLimits(root_.string());
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("net/ipv4/tcp_rmem: \"4096 131072\" is not three byte"),
            std::string::npos)
      << l.status().message();
  fs::remove(root_ / "net/ipv4/tcp_wmem");
  write("tcp_rmem", "4096 131072 6291456\n");
  l = readTcpBufferLimits(root_.string());
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("tcp_wmem: cannot be read"), std::string::npos);
}

TEST(TcpWindowCeiling, HalfTheBufferPerRoundTrip) {
  // Linux's default 6 MiB over 230 ms: 3-4 MiB a round trip, 109-146 Mbit/s.
  EXPECT_NEAR(windowCeilingBitsPerSecond(6 << 20, 0.230), 109.4e6, 0.1e6);
  EXPECT_NEAR(windowCeilingBitsPerSecond(6 << 20, 0.230, 2.0 / 3), 145.9e6, 0.1e6);
  // 55 MiB (what the namespace network gives a 1 Gbit/s, 230 ms link):
  // 1.0 Gbit/s.
  EXPECT_NEAR(windowCeilingBitsPerSecond(int64_t{55} << 20, 0.230), 1.003e9, 0.001e9);
  const std::string line =
      describeWindowCeiling({6 << 20, 4 << 20, 131072}, "tokyo (rank 1)", 0.230);
  for (const char* part :
       {"230 ms, to tokyo (rank 1)", "at most 109-146 Mbit/s", "may grow to 6 MiB",
        "net.ipv4.tcp_rmem", "send buffers to 4 MiB", "at 55 MiB or more",
        "or 7-10 data connections per peer", "transport.connections"}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " not in: " << line;
  }
  EXPECT_EQ(line.find("its 1 data"), std::string::npos) << line;
  // Where both shares need as many: one figure.
  EXPECT_NE(describeWindowCeiling({32 << 20, 32 << 20, 131072}, "tokyo (rank 1)", 0.230)
                .find("or 2 data connections per peer"),
            std::string::npos);
  // Striped over 8 connections: 8 windows in flight.
  const std::string striped =
      describeWindowCeiling({6 << 20, 4 << 20, 131072}, "tokyo (rank 1)", 0.230, 8);
  EXPECT_NE(striped.find("at most 109-146 Mbit/s, its 8 data connections "
                         "(transport.connections) 0.875-1.17 Gbit/s"),
            std::string::npos)
      << striped;
}

}  // namespace
}  // namespace geo::app
