#include "controller/kube/leader_election.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "tests/controller/kube/fake_client.h"

namespace geo::kube {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;
using testing::FakeClient;

LeaseRecord record(std::string holder, int transitions = 0) {
  return LeaseRecord{std::move(holder), 15, "2024-01-01T00:00:00.000000Z",
                     "2024-01-01T00:00:05.000000Z", transitions};
}

TEST(LeaseRecordTest, RoundTripsThroughTheLeaseSpec) {
  json lease = {{"metadata", {{"name", "geo"}, {"resourceVersion", "3"}}}};
  const LeaseRecord written = record("pod-a", 2);
  written.writeTo(lease);
  EXPECT_EQ(lease["spec"]["holderIdentity"], "pod-a");
  EXPECT_EQ(lease["spec"]["leaseDurationSeconds"], 15);
  EXPECT_EQ(lease["metadata"]["resourceVersion"], "3");
  EXPECT_EQ(LeaseRecord::fromLease(lease), written);
  EXPECT_EQ(LeaseRecord::fromLease(json::object()), LeaseRecord{});
}

TEST(NextLeaseRecordTest, Decisions) {
  const std::string now = "2024-01-01T00:01:00.000000Z";
  // No Lease: create it.
  auto next = nextLeaseRecord(std::nullopt, "me", false, 15, now);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, (LeaseRecord{"me", 15, now, now, 0}));
  // Held by a live other: hands off.
  EXPECT_FALSE(nextLeaseRecord(record("other", 4), "me", false, 15, now));
  // Held by another whose lease expired: take over, one more transition.
  next = nextLeaseRecord(record("other", 4), "me", true, 15, now);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, (LeaseRecord{"me", 15, now, now, 5}));
  // Released (no holder): take it even if not expired.
  next = nextLeaseRecord(record("", 4), "me", false, 10, now);
  ASSERT_TRUE(next);
  EXPECT_EQ(next->leaseTransitions, 5);
  EXPECT_EQ(next->leaseDurationSeconds, 10);
  // Ours: renew, keeping acquireTime and transitions.
  next = nextLeaseRecord(record("me", 4), "me", false, 15, now);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, (LeaseRecord{"me", 15, "2024-01-01T00:00:00.000000Z", now, 4}));
}

LeaderElectionConfig fastConfig(std::string identity) {
  LeaderElectionConfig config;
  config.leaseNamespace = "geotrain-system";
  config.leaseName = "geotrain-controller";
  config.identity = std::move(identity);
  config.leaseDuration = milliseconds(400);
  config.renewDeadline = milliseconds(200);
  config.retryPeriod = milliseconds(20);
  return config;
}

TEST(LeaderElectorTest, RejectsBadTimings) {
  FakeClient client;
  LeaderElectionConfig config = fastConfig("me");
  config.renewDeadline = config.leaseDuration;
  EXPECT_THROW(LeaderElector(client, config), Error);
  config = fastConfig("");
  EXPECT_THROW(LeaderElector(client, config), Error);
}

// Creates the Lease, leads, renews with the read resourceVersion, and stops
// leading when renewals fail for renewDeadline.
TEST(LeaderElectorTest, AcquiresRenewsAndLosesOnRenewFailure) {
  FakeClient client;
  std::mutex mu;
  std::optional<json> lease;    // what the scripted server holds
  std::atomic<int> version{0};  // read by the test thread too
  std::atomic<bool> failWrites{false};
  client.onCall = [&](const ApiRequest& request) -> ApiResult<json> {
    std::lock_guard lock(mu);
    EXPECT_EQ(
        request.path.rfind("/apis/coordination.k8s.io/v1/namespaces/geotrain-system/leases", 0),
        0u);
    if (request.method == "GET") {
      if (!lease) return decodeApiError(404, R"({"kind":"Status","reason":"NotFound"})");
      return *lease;
    }
    if (failWrites) return decodeApiError(500, "");
    json body = json::parse(request.body);
    if (request.method == "PUT") {
      EXPECT_EQ(body["metadata"]["resourceVersion"], std::to_string(version.load()));
    }
    body["metadata"]["resourceVersion"] = std::to_string(++version);
    lease = body;
    return body;
  };
  std::atomic<int> started{0}, stopped{0};
  LeaderElectionConfig config = fastConfig("pod-a");
  config.onStartedLeading = [&] { ++started; };
  config.onStoppedLeading = [&] { ++stopped; };
  LeaderElector elector(client, config);
  CancelToken cancel;
  std::thread runner([&] { elector.run(cancel); });
  for (int i = 0; i < 500 && version < 4; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(started, 1);
  EXPECT_TRUE(elector.isLeader());
  EXPECT_EQ(elector.observedLeader(), "pod-a");
  {
    std::lock_guard lock(mu);
    ASSERT_TRUE(lease);
    const LeaseRecord held = LeaseRecord::fromLease(*lease);
    EXPECT_EQ(held.holderIdentity, "pod-a");
    EXPECT_EQ(held.leaseDurationSeconds, 1);  // 400 ms, rounded up
    EXPECT_EQ(held.leaseTransitions, 0);
    EXPECT_NE(held.acquireTime, "");
  }
  failWrites = true;
  runner.join();  // run() returns after renewDeadline without a renewal
  EXPECT_EQ(stopped, 1);
  EXPECT_FALSE(elector.isLeader());
  EXPECT_EQ(client.requests().front().method, "GET");
  EXPECT_EQ(client.requests()[1].method, "POST");
}

// A live holder keeps renewing: no takeover. When its renewals stop, the
// candidate waits the holder's leaseDurationSeconds on its own clock, then
// takes over.
TEST(LeaderElectorTest, TakesOverOnlyAfterTheHolderStopsRenewing) {
  FakeClient client;
  std::mutex mu;
  json lease = {{"metadata", {{"name", "geotrain-controller"}, {"resourceVersion", "1"}}}};
  LeaseRecord held = record("pod-a", 3);
  held.leaseDurationSeconds = 1;  // the holder's duration is what counts
  held.writeTo(lease);
  std::atomic<bool> holderAlive{true};
  int renewals = 0;
  client.onCall = [&](const ApiRequest& request) -> ApiResult<json> {
    std::lock_guard lock(mu);
    if (request.method == "GET") {
      if (holderAlive) {  // the holder renewed since the last read
        lease["spec"]["renewTime"] =
            "2024-01-01T00:00:" + std::to_string(10 + ++renewals % 50) + ".000000Z";
        lease["metadata"]["resourceVersion"] = std::to_string(100 + renewals);
      }
      return lease;
    }
    json body = json::parse(request.body);
    if (body["metadata"]["resourceVersion"] != lease["metadata"]["resourceVersion"]) {
      return decodeApiError(409, R"({"kind":"Status","reason":"Conflict","code":409})");
    }
    body["metadata"]["resourceVersion"] = "999";
    lease = body;
    return body;
  };
  std::atomic<bool> leading{false};
  LeaderElectionConfig config = fastConfig("pod-b");
  config.onStartedLeading = [&] { leading = true; };
  FakeClock clock;
  LeaderElector elector(client, config, clock);
  CancelToken cancel;
  std::thread runner([&] { elector.run(cancel); });
  // One retry period of fake time once the candidate sleeps; returns after
  // its next read of the Lease, once it sleeps again. (The fake client
  // records a request before it answers it: returning on the record alone
  // would let the test stop the holder's renewals before this read saw one.)
  auto retryPeriod = [&] {
    const size_t before = client.requests().size();
    ASSERT_TRUE(clock.awaitWaiters(1));
    clock.advance(config.retryPeriod);
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (client.requests().size() == before && std::chrono::steady_clock::now() < limit)
      std::this_thread::yield();
    ASSERT_GT(client.requests().size(), before);
    ASSERT_TRUE(clock.awaitWaiters(1));
  };
  for (int i = 0; i < 75; ++i) retryPeriod();  // 1.5 s, longer than the holder's 1 s
  EXPECT_FALSE(leading);
  EXPECT_EQ(elector.observedLeader(), "pod-a");
  holderAlive = false;
  int periods = 0;
  while (!leading && periods < 200) {
    retryPeriod();
    ++periods;
  }
  EXPECT_TRUE(leading);
  // The holder's 1 s on the candidate's clock, counted from the last change
  // it saw, then at most one more retry period.
  EXPECT_GE(periods * config.retryPeriod, milliseconds(1000));
  EXPECT_LE(periods * config.retryPeriod, milliseconds(1040));
  {
    std::lock_guard lock(mu);
    const LeaseRecord taken = LeaseRecord::fromLease(lease);
    EXPECT_EQ(taken.holderIdentity, "pod-b");
    EXPECT_EQ(taken.leaseTransitions, 4);
  }
  cancel.cancel();
  runner.join();
  // Released on cancel so a standby need not wait for expiry.
  std::lock_guard lock(mu);
  EXPECT_EQ(LeaseRecord::fromLease(lease).holderIdentity, "");
}

}  // namespace
}  // namespace geo::kube
