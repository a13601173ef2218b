#include "controller/kube/watch.h"

#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "tests/controller/kube/fake_client.h"

namespace geo::kube {
namespace {

using nlohmann::json;
using testing::FakeClient;
using testing::queryValue;
using testing::ScriptedStream;

std::string eventLine(std::string_view type, std::string_view name, std::string_view version) {
  return json{{"type", type},
              {"object",
               {{"kind", "ConfigMap"},
                {"metadata", {{"name", name}, {"resourceVersion", version}}},
                {"data", {{"k", "line\nbreak \xc3\xa9"}}}}}}
             .dump() +
         "\n";
}

std::vector<std::string> splitAll(LineSplitter& splitter, const std::vector<std::string>& chunks) {
  std::vector<std::string> lines;
  for (const std::string& chunk : chunks) {
    EXPECT_TRUE(splitter.feed(chunk, [&](std::string_view line) { lines.emplace_back(line); }));
  }
  return lines;
}

TEST(LineSplitterTest, EveryTwoWaySplitGivesTheSameLines) {
  const std::string stream = eventLine("ADDED", "a", "1") + eventLine("MODIFIED", "a", "2") +
                             "\r\n" + eventLine("DELETED", "a", "3");
  const std::vector<std::string> expected = {eventLine("ADDED", "a", "1"),
                                             eventLine("MODIFIED", "a", "2"),
                                             eventLine("DELETED", "a", "3")};
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    LineSplitter splitter;
    const auto lines = splitAll(splitter, {stream.substr(0, cut), stream.substr(cut)});
    ASSERT_EQ(lines.size(), 3u) << "cut at " << cut;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(lines[i] + "\n", expected[i]) << "cut at " << cut;
    }
    EXPECT_EQ(splitter.buffered(), 0u);
  }
}

TEST(LineSplitterTest, RandomChunkBoundaries) {
  std::string stream;
  std::vector<std::string> expected;
  for (int i = 0; i < 200; ++i) {
    const std::string line = eventLine("ADDED", "obj-" + std::to_string(i), std::to_string(i));
    expected.push_back(line.substr(0, line.size() - 1));
    stream += line;
  }
  std::mt19937 rng(7);
  for (int round = 0; round < 20; ++round) {
    std::vector<std::string> chunks;
    for (size_t pos = 0; pos < stream.size();) {
      const size_t size = std::uniform_int_distribution<size_t>(1, 400)(rng);
      chunks.push_back(stream.substr(pos, size));
      pos += size;
    }
    LineSplitter splitter;
    EXPECT_EQ(splitAll(splitter, chunks), expected);
  }
}

TEST(LineSplitterTest, SingleBytesAndPartialTail) {
  LineSplitter splitter;
  std::vector<std::string> chunks;
  for (const char c : std::string("{\"a\":1}\n{\"b\"")) chunks.emplace_back(1, c);
  EXPECT_EQ(splitAll(splitter, chunks), std::vector<std::string>{"{\"a\":1}"});
  EXPECT_EQ(splitter.buffered(), 4u);
}

TEST(LineSplitterTest, OverlongLineBreaksTheStream) {
  LineSplitter splitter(8);
  std::vector<std::string> lines;
  const auto onLine = [&](std::string_view line) { lines.emplace_back(line); };
  EXPECT_TRUE(splitter.feed("1234\n12345", onLine));
  EXPECT_FALSE(splitter.feed("6789", onLine));
  EXPECT_EQ(lines, std::vector<std::string>{"1234"});
  EXPECT_EQ(splitter.buffered(), 0u);
}

TEST(WatchEventTest, ParsesTypes) {
  const auto added = parseWatchEvent(eventLine("ADDED", "a", "1"));
  ASSERT_TRUE(added.ok());
  EXPECT_EQ(added->type, WatchEventType::kAdded);
  EXPECT_EQ(added->object["metadata"]["name"], "a");
  EXPECT_EQ(
      parseWatchEvent(R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}})")->type,
      WatchEventType::kBookmark);
  EXPECT_EQ(parseWatchEvent(R"({"type":"ERROR","object":{"kind":"Status","code":410}})")->type,
            WatchEventType::kError);
  for (const char* bad : {"not json", "[]", R"({"object":{}})", R"({"type":"ADDED"})",
                          R"({"type":"RENAMED","object":{}})"}) {
    const auto event = parseWatchEvent(bad);
    ASSERT_FALSE(event.ok()) << bad;
    EXPECT_EQ(event.error().code, StatusCode::kDataLoss) << bad;
  }
  EXPECT_EQ(watchEventTypeName(WatchEventType::kModified), "MODIFIED");
}

TEST(WatchOnceTest, BuildsTheRequestAndDecodesSplitEvents) {
  FakeClient client;
  client.onStream = [](const ApiRequest&) {
    const std::string all = eventLine("ADDED", "a", "11") + eventLine("MODIFIED", "a", "12");
    // Three events in odd pieces: one split mid-object, two in one chunk.
    return ScriptedStream{{all.substr(0, 10), all.substr(10, 70), all.substr(80),
                           R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"13"}}})"
                           "\n"}};
  };
  std::vector<WatchEvent> events;
  CancelToken cancel;
  WatchOptions options;
  options.resourceVersion = "10";
  options.labelSelector = "a=b";
  options.timeout = std::chrono::seconds(60);
  const auto result = client.watchOnce(
      resources::kConfigMaps, "ns", options,
      [&](WatchEvent&& e) { events.push_back(std::move(e)); }, cancel);
  ASSERT_TRUE(result.ok()) << result.status().toString();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, WatchEventType::kAdded);
  EXPECT_EQ(events[1].object["metadata"]["resourceVersion"], "12");
  EXPECT_EQ(events[2].type, WatchEventType::kBookmark);
  const ApiRequest request = client.lastRequest();
  EXPECT_EQ(request.path, "/api/v1/namespaces/ns/configmaps");
  EXPECT_EQ(queryValue(request, "watch"), "1");
  EXPECT_EQ(queryValue(request, "resourceVersion"), "10");
  EXPECT_EQ(queryValue(request, "allowWatchBookmarks"), "true");
  EXPECT_EQ(queryValue(request, "timeoutSeconds"), "60");
  EXPECT_EQ(queryValue(request, "labelSelector"), "a=b");
}

TEST(WatchOnceTest, ErrorEventEndsTheWatchWithItsStatus) {
  FakeClient client;
  client.onStream = [](const ApiRequest&) {
    return ScriptedStream{
        {eventLine("ADDED", "a", "11"),
         R"json({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 10 (20)","reason":"Expired","code":410}})json"
         "\n",
         eventLine("ADDED", "b", "21")}};
  };
  std::vector<WatchEvent> events;
  CancelToken cancel;
  const auto result = client.watchOnce(
      resources::kConfigMaps, "", {}, [&](WatchEvent&& e) { events.push_back(std::move(e)); },
      cancel);
  ASSERT_FALSE(result.ok());
  EXPECT_TRUE(result.error().isGone());
  EXPECT_EQ(result.error().message, "too old resource version: 10 (20)");
  EXPECT_EQ(events.size(), 1u);
}

TEST(WatchOnceTest, TruncatedAndGarbledStreams) {
  FakeClient client;
  CancelToken cancel;
  client.onStream = [](const ApiRequest&) {
    return ScriptedStream{{eventLine("ADDED", "a", "1").substr(0, 20)}};
  };
  auto result = client.watchOnce(
      resources::kPods, "", {}, [](WatchEvent&&) {}, cancel);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, StatusCode::kUnknown);
  client.onStream = [](const ApiRequest&) { return ScriptedStream{{"garbage\n"}}; };
  result = client.watchOnce(
      resources::kPods, "", {}, [](WatchEvent&&) {}, cancel);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code, StatusCode::kDataLoss);
}

const BackoffPolicy kFast{std::chrono::milliseconds(1), std::chrono::milliseconds(5), 2.0, 0.5};

TEST(WatchWithResumeTest, ResumesFromTheLastVersionAndStopsOnGone) {
  FakeClient client;
  std::atomic<int> streams{0};
  client.onStream = [&](const ApiRequest&) {
    switch (streams++) {
      case 0:  // events then a bookmark, then the server's timeout
        return ScriptedStream{
            {eventLine("ADDED", "a", "11"),
             R"({"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"15"}}})"
             "\n"}};
      case 1:  // a broken connection
        return ScriptedStream{{eventLine("MODIFIED", "a", "16")},
                              localError(StatusCode::kUnknown, "connection reset")};
      case 2:  // an API server restart
        return ScriptedStream{{}, decodeApiError(503, "")};
      default: return ScriptedStream{{}, decodeApiError(410, R"({"kind":"Status","code":410})")};
    }
  };
  std::vector<std::string> seen;
  CancelToken cancel;
  WatchOptions options;
  options.resourceVersion = "10";
  const ApiError end = watchWithResume(
      client, resources::kConfigMaps, "ns", options,
      [&](WatchEvent&& e) { seen.push_back(metadataField(e.object, "resourceVersion")); }, cancel,
      kFast);
  EXPECT_TRUE(end.isGone());
  EXPECT_EQ(seen, (std::vector<std::string>{"11", "15", "16"}));
  const auto requests = client.requests();
  ASSERT_EQ(requests.size(), 4u);
  EXPECT_EQ(queryValue(requests[0], "resourceVersion"), "10");
  EXPECT_EQ(queryValue(requests[1], "resourceVersion"), "15");  // the bookmark's
  EXPECT_EQ(queryValue(requests[2], "resourceVersion"), "16");
  EXPECT_EQ(queryValue(requests[3], "resourceVersion"), "16");
}

TEST(WatchWithResumeTest, CancelFromAnotherThreadIsPrompt) {
  FakeClient client;
  client.onStream = [](const ApiRequest&) {
    ScriptedStream stream;
    stream.holdOpen = true;
    return stream;
  };
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    cancel.cancel();
  });
  const auto start = std::chrono::steady_clock::now();
  const ApiError end = watchWithResume(
      client, resources::kPods, "", {}, [](WatchEvent&&) {}, cancel, kFast);
  canceller.join();
  EXPECT_TRUE(end.isCancelled());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace geo::kube
