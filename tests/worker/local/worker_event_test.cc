// Progress events written and read with the one definition
// (worker/local/worker_event.h): the exact lines the worker prints, and
// what geotrain local reads back from them.

#include "worker/local/worker_event.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

namespace geo::local {
namespace {

TEST(WorkerEventFormat, StartLine) {
  WorkerEvent e;
  e.kind = EventKind::kStart;
  e.rank = 1;
  e.time = 0.0123456;
  e.region = "tokyo";
  e.localRank = 0;
  e.worldSize = 4;
  e.model = "mlp 784-256-10";
  e.parameters = 203530;
  e.shardSamples = 15000;
  e.steps = 800;
  e.algorithm = "dts";
  e.resumedAt = 0;
  EXPECT_EQ(formatWorkerEvent(e),
            R"({"event":"start","rank":1,"time":0.012,"region":"tokyo","localRank":0,)"
            R"("worldSize":4,"model":"mlp 784-256-10","parameters":203530,"shardSamples":15000,)"
            R"("steps":800,"algorithm":"dts","resumedAt":0})");
}

TEST(WorkerEventFormat, ProgressLineRoundsToTheDocumentedDigits) {
  WorkerEvent e;
  e.kind = EventKind::kProgress;
  e.rank = 0;
  e.time = 47.1;
  e.step = 1000;
  e.stepEndedAt = 46.91234;
  e.loss = 0.13712345678;
  e.lr = 0.05;
  e.samplesPerSecond = 1364.2345;
  e.evalAccuracy = 0.869912345;
  e.evalStep = 1000;
  e.evalAgeSeconds = 0.123456;
  e.stepSecondsMax = 0.98765;
  e.sync.delay = 2;
  e.sync.stalenessMean = 1.987654;
  e.bytes.wanSent = 6482904;
  EXPECT_EQ(
      formatWorkerEvent(e),
      R"({"event":"progress","rank":0,"time":47.1,"step":1000,"stepEndedAt":46.912,)"
      R"("loss":0.137123,"lr":0.05,"samplesPerSecond":1364.2,"evalAccuracy":0.869912,"evalStep":1000,)"
      R"("evalAgeSeconds":0.1235,"stepSecondsMax":0.9877,)"
      R"("sync":{"delay":2,"stalenessMean":1.988},"bytes":{"wanSent":6482904}})");
}

TEST(WorkerEventFormat, ANonFiniteLossIsNullAndFlagged) {
  WorkerEvent e;
  e.kind = EventKind::kDone;
  e.step = 10;
  e.loss = std::numeric_limits<double>::quiet_NaN();
  e.modelHash = "00ff";
  EXPECT_EQ(formatWorkerEvent(e),
            R"({"event":"done","step":10,"loss":null,"nonFinite":["loss"],"modelHash":"00ff"})");
  const auto back = parseWorkerEvent(formatWorkerEvent(e));
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->loss.has_value());
  EXPECT_EQ(back->nonFinite, std::vector<std::string>{"loss"});
}

TEST(WorkerEventFormat, JoinedDoneAfterEndAndErrorLines) {
  WorkerEvent joined;
  joined.kind = EventKind::kJoined;
  joined.rank = 1;
  joined.time = 1.9;
  joined.step = 412;
  joined.fromStep = 0;
  joined.transferred = true;
  joined.jobFinished = false;
  joined.stateTransferSeconds = 0.05;
  EXPECT_EQ(formatWorkerEvent(joined),
            R"({"event":"joined","rank":1,"time":1.9,"step":412,"fromStep":0,"transferred":true,)"
            R"("jobFinished":false,"stateTransferSeconds":0.05})");
  WorkerEvent late;
  late.kind = EventKind::kDone;
  late.step = 800;
  late.arrivedAfterEnd = true;
  EXPECT_EQ(formatWorkerEvent(late), R"({"event":"done","step":800,"arrivedAfterEnd":true})");
  WorkerEvent error;
  error.kind = EventKind::kError;
  error.message = "bad \"path\"\n\tthere";
  EXPECT_EQ(formatWorkerEvent(error), R"({"event":"error","message":"bad \"path\"\n\tthere"})");
}

TEST(WorkerEventFormat, WhatIsWrittenIsReadBack) {
  WorkerEvent e;
  e.kind = EventKind::kDone;
  e.rank = 2;
  e.time = 3.25;
  e.step = 800;
  e.loss = 0.25;
  e.testAccuracy = 0.875;
  e.joinedAt = 412;
  e.modelHash = "0123456789abcdef";
  e.sync.delay = 4;
  e.sync.rounds = 200;
  e.sync.appliedUpdates = 600;
  e.sync.stalenessMax = 4;
  e.sync.codecSeconds = 0.5;
  e.sync.rejected = 1;
  e.bytes.payload = 99;
  e.stepTime = {800, 2.5, 1.25, 0.5, 0.125, 0.625};
  e.maxRssBytes = uint64_t{5} << 30;
  const auto back = parseWorkerEvent(formatWorkerEvent(e));
  ASSERT_TRUE(back.ok()) << back.status().toString();
  EXPECT_EQ(back->kind, EventKind::kDone);
  EXPECT_EQ(back->name, "done");
  EXPECT_EQ(back->rank, 2);
  EXPECT_EQ(back->time, 3.25);
  EXPECT_EQ(back->step, 800);
  EXPECT_EQ(back->loss, 0.25);
  EXPECT_EQ(back->testAccuracy, 0.875);
  EXPECT_EQ(back->joinedAt, 412);
  EXPECT_EQ(back->modelHash, "0123456789abcdef");
  EXPECT_EQ(back->sync.delay, 4);
  EXPECT_EQ(back->sync.rounds, 200);
  EXPECT_EQ(back->sync.appliedUpdates, 600);
  EXPECT_EQ(back->sync.stalenessMax, 4);
  EXPECT_EQ(back->sync.codecSeconds, 0.5);
  EXPECT_EQ(back->sync.rejected, 1);
  EXPECT_EQ(back->bytes.payload, 99u);
  EXPECT_FALSE(back->bytes.wanSent.has_value());
  EXPECT_EQ(back->stepTime.steps, 800);
  EXPECT_EQ(back->stepTime.computeSeconds, 2.5);
  EXPECT_EQ(back->stepTime.syncSeconds, 1.25);
  EXPECT_EQ(back->stepTime.codecSeconds, 0.5);
  EXPECT_EQ(back->stepTime.encodeSeconds, 0.125);
  EXPECT_EQ(back->stepTime.waitSeconds, 0.625);
  EXPECT_EQ(back->maxRssBytes, uint64_t{5} << 30);
}

TEST(WorkerEventFormat, InvalidUtf8IsReplacedNotThrown) {
  WorkerEvent e;
  e.kind = EventKind::kError;
  e.message = std::string("file \xff");
  const std::string line = formatWorkerEvent(e);
  EXPECT_TRUE(parseWorkerEvent(line).ok()) << line;
}

}  // namespace
}  // namespace geo::local
