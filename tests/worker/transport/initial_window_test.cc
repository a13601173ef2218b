// transport.tcpInitialWindow: host routes toward the WAN peers that carry
// the initial windows, checked where they act -- in network namespaces of
// the namespace network, with the kernel's own route lookup and a real TCP
// connection's congestion window (TCP_INFO). Needs root; skips itself
// otherwise.

#include "worker/transport/initial_window.h"

#include <arpa/inet.h>
#include <linux/capability.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "worker/wan/netns_network.h"

namespace geo::transport {
namespace {

using wan::siteAddress;

wan::WanShape twoSites() {
  wan::WanShape shape;
  shape.sites = {"a", "b"};
  shape.oneWay = {{wan::Microseconds(0), wan::Microseconds(20'000)},
                  {wan::Microseconds(20'000), wan::Microseconds(0)}};
  shape.site.resize(2);
  return shape;
}

// Takes CAP_NET_ADMIN out of the calling thread's effective set
// (capabilities are per thread: this one only). False, with a failure
// recorded, where that fails.
bool dropNetAdmin() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &header, data) != 0) {
    ADD_FAILURE() << "capget: " << std::strerror(errno);
    return false;
  }
  data[CAP_NET_ADMIN / 32].effective &= ~(1u << (CAP_NET_ADMIN % 32));
  if (::syscall(SYS_capset, &header, data) != 0) {
    ADD_FAILURE() << "capset: " << std::strerror(errno);
    return false;
  }
  return true;
}

class InitialWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status s = wan::checkNetnsAllowed(); !s.ok()) GTEST_SKIP() << s.message();
    auto net = wan::NetnsNetwork::create(twoSites());
    ASSERT_TRUE(net.ok()) << net.status().toString();
    net_ = std::move(*net);
  }

  // Runs `fn` in site `site`'s namespace.
  void in(size_t site, const std::function<void()>& fn) {
    const Status s = net_->runIn(site, fn);
    ASSERT_TRUE(s.ok()) << s.toString();
  }

  // The congestion window (segments) of a fresh TCP connection from site a
  // to a listener in site b, read as soon as it is established.
  uint32_t freshConnectionCwnd() {
    int listener = -1;
    sockaddr_in b{};
    b.sin_family = AF_INET;
    b.sin_port = htons(5002);
    ::inet_pton(AF_INET, siteAddress(1).c_str(), &b.sin_addr);
    in(1, [&] {
      listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const int one = 1;
      ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&b), sizeof b), 0)
          << std::strerror(errno);
      EXPECT_EQ(::listen(listener, 4), 0);
    });
    uint32_t cwnd = 0;
    in(0, [&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&b), sizeof b), 0)
          << std::strerror(errno);
      tcp_info info{};
      socklen_t len = sizeof info;
      EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len), 0);
      cwnd = info.tcpi_snd_cwnd;
      ::close(fd);
    });
    ::close(listener);
    return cwnd;
  }

  std::unique_ptr<wan::NetnsNetwork> net_;
};

TEST_F(InitialWindowTest, AHostRouteToEachPeerCarriesBothWindowsAndTcpStartsWithThem) {
  const std::string peer = "tcp://" + siteAddress(1) + ":7000";
  // The kernel's default first: 10 segments, no window on the route.
  EXPECT_EQ(freshConnectionCwnd(), 10u);
  in(0, [&] {
    auto before = routeWindows(siteAddress(1));
    ASSERT_TRUE(before.ok()) << before.status().toString();
    EXPECT_EQ(before->initcwnd, 0u);
    EXPECT_EQ(before->initrwnd, 0u);

    auto routes = setInitialWindow({peer, peer}, 100);  // twice: one route
    ASSERT_TRUE(routes.ok()) << routes.status().toString();
    ASSERT_EQ(routes->size(), 1u);
    EXPECT_EQ((*routes)[0].peer, peer);
    EXPECT_EQ((*routes)[0].address, siteAddress(1));
    EXPECT_EQ((*routes)[0].device, "geo0");  // the site's TUN device, as before
    EXPECT_EQ((*routes)[0].via, "");
    auto after = routeWindows(siteAddress(1));
    ASSERT_TRUE(after.ok()) << after.status().toString();
    EXPECT_EQ(after->initcwnd, 100u);
    EXPECT_EQ(after->initrwnd, 100u);
    // Only the peer's address: the rest of the subnet keeps the kernel's.
    auto other = routeWindows("198.18.0.77");
    ASSERT_TRUE(other.ok()) << other.status().toString();
    EXPECT_EQ(other->initcwnd, 0u);
    // Again, with another size: the route is replaced, not doubled.
    routes = setInitialWindow({peer}, 40);
    ASSERT_TRUE(routes.ok()) << routes.status().toString();
    EXPECT_EQ(routeWindows(siteAddress(1))->initcwnd, 40u);
  });
  // And TCP opens with it.
  EXPECT_EQ(freshConnectionCwnd(), 40u);
}

TEST_F(InitialWindowTest, ThisHostsOwnAddressesAreLeftAlone) {
  in(0, [&] {
    auto routes = setInitialWindow(
        {"tcp://127.0.0.1:7000", "tcp://" + siteAddress(0) + ":7000", "tcp://localhost:7000"}, 100);
    ASSERT_TRUE(routes.ok()) << routes.status().toString();
    EXPECT_TRUE(routes->empty());
  });
}

TEST_F(InitialWindowTest, BadInputAndAMissingCapabilitySayWhatIsWrong) {
  in(0, [&] {
    auto notTcp = setInitialWindow({"ipc:///tmp/x"}, 100);
    ASSERT_FALSE(notTcp.ok());
    EXPECT_EQ(notTcp.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(notTcp.status().message().find("ipc:///tmp/x: not a TCP endpoint"), std::string::npos)
        << notTcp.status().message();
    auto tooLarge = setInitialWindow({"tcp://" + siteAddress(1) + ":7000"}, 5000);
    ASSERT_FALSE(tooLarge.ok());
    EXPECT_NE(tooLarge.status().message().find("5000 segments: 1 to 1000"), std::string::npos)
        << tooLarge.status().message();

    // Without CAP_NET_ADMIN (capabilities are per thread: this one only).
    ASSERT_TRUE(dropNetAdmin());
    auto denied = setInitialWindow({"tcp://" + siteAddress(1) + ":7000"}, 100);
    ASSERT_FALSE(denied.ok());
    EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied);
    EXPECT_NE(denied.status().message().find("needs CAP_NET_ADMIN"), std::string::npos)
        << denied.status().message();
    EXPECT_EQ(routeWindows(siteAddress(1))->initcwnd, 0u);  // nothing half-done
  });
}

TEST_F(InitialWindowTest, AHostThatDoesNotResolveIsSaidAndTheOthersGetTheirRoutes) {
  in(0, [&] {
    // A host that does not resolve (yet) is said, not an error: the others
    // still get their routes.
    auto unknown = setInitialWindow(
        {"tcp://no-such-host.invalid:7000", "tcp://" + siteAddress(1) + ":7000"}, 100);
    ASSERT_TRUE(unknown.ok()) << unknown.status().toString();
    ASSERT_EQ(unknown->size(), 2u);
    EXPECT_NE((*unknown)[0].unresolved.find(
                  "tcp://no-such-host.invalid:7000: cannot resolve no-such-host.invalid"),
              std::string::npos)
        << (*unknown)[0].unresolved;
    EXPECT_EQ((*unknown)[0].address, "");
    EXPECT_EQ((*unknown)[1].unresolved, "");
    EXPECT_EQ(routeWindows(siteAddress(1))->initcwnd, 100u);
  });
}

// An init container with CAP_NET_ADMIN sets the windows; the worker after it,
// without the capability, finds them set and writes nothing.
TEST_F(InitialWindowTest, WindowsAlreadySetNeedNoPrivilege) {
  const std::string peer = "tcp://" + siteAddress(1) + ":7000";
  in(0, [&] {
    auto first = setInitialWindow({peer}, 100);
    ASSERT_TRUE(first.ok()) << first.status().toString();
    ASSERT_EQ(first->size(), 1u);
    EXPECT_FALSE((*first)[0].alreadySet);

    ASSERT_TRUE(dropNetAdmin());
    auto again = setInitialWindow({peer}, 100);
    ASSERT_TRUE(again.ok()) << again.status().toString();
    ASSERT_EQ(again->size(), 1u);
    EXPECT_TRUE((*again)[0].alreadySet);
    EXPECT_EQ((*again)[0].device, "geo0");
    // Another size is a change, which needs the capability.
    auto other = setInitialWindow({peer}, 50);
    ASSERT_FALSE(other.ok());
    EXPECT_EQ(other.status().code(), StatusCode::kPermissionDenied);
  });
}

}  // namespace
}  // namespace geo::transport
