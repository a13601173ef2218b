#pragma once
// WorkerEvent: one line of a worker's `--progress-format jsonl` output, the
// contract between geotrain-worker and `geotrain local`, defined once here:
// the worker writes it (formatWorkerEvent) and `geotrain local` reads it
// (parseWorkerEvent), both with nlohmann/json (docs/worker-progress.md is the
// reference). A worker prints one JSON object per line on stdout:
//   {"event":"start","rank":0,"region":"london","localRank":0,"worldSize":4,
//    "model":"mlp","parameters":203530,"shardSamples":15000,"steps":1000,
//    "algorithm":"dts","time":0.01}
//   {"event":"progress","rank":0,"step":50,"time":3.2,"loss":0.61,"lr":0.05,
//    "samplesPerSecond":1200.5,"evalAccuracy":0.81,"evalStep":50,
//    "evalAgeSeconds":0.4,
//    "sync":{"delay":4,"appliedUpdates":12,"stalenessMean":4.0,
//            "stalenessMax":4,"missing":0,"waitSeconds":0.2},
//    "bytes":{"wanSent":123456,"wanReceived":120000,"lanSent":0,
//             "lanReceived":0,"payload":900000},
//    "stepTime":{"steps":50,"computeSeconds":2.1,"syncSeconds":0.9,
//                "codecSeconds":0.1,"waitSeconds":0.7}}
//   {"event":"done", ...progress keys..., "testAccuracy":0.874}
//   {"event":"error","rank":0,"message":"..."}
//   {"event":"joined","rank":1,"step":412,"fromStep":0,"transferred":true,
//    "jobFinished":false,"stateTransferSeconds":0.05,"time":1.9}
//     (before the first step: the step it continues from, and whether it
//     took a live peer's model to get there)
// progress and done also carry "stepSecondsMax" (the longest step so far,
// after the first: a stall shows there), sync.peersDown, sync.rejoins and
// the other membership counts; done carries "modelHash" (FNV-1a of the final
// parameters: workers that agree on the final model print the same).
// An evaluation in the background measures the parameters of an earlier
// step: evalStep is that step and evalAgeSeconds how long before this line
// they were taken (0 and the line's own step for one run in line).
// `time` is seconds since that worker started; bytes.* are cumulative.
//
// Writing: every member that is set is written, in one fixed order (event,
// rank, time, the start members, step, the joined members, loss, ..., sync,
// bytes; the order of the struct below), numbers rounded to the precision
// the document gives (time to the millisecond, loss and lr to 6 significant
// digits, seconds to 4). A loss that is no finite number is written as null
// with "nonFinite":["loss"] (JSON has no NaN).
//
// Parsing is lenient on content and strict on form: the line must be a JSON
// object with a string "event"; any other key may be missing (the field stays
// nullopt / empty) or of the wrong type (treated as missing), and unknown keys
// and unknown event names are ignored (kind kOther). Pure function; never
// throws.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace geo::local {

enum class EventKind { kStart, kJoined, kProgress, kDone, kError, kOther };

struct SyncStats {
  std::optional<double> delay;    // the DTS delay D in steps now in force
  std::optional<double> lrScale;  // DTS: the factor on the gradient under that delay
  std::optional<int64_t> appliedUpdates;
  std::optional<double> stalenessMean;
  std::optional<double> stalenessMax;
  std::optional<int64_t> missing;  // contributions that never arrived
  std::optional<double> waitSeconds;
  std::optional<int64_t> peersDown;
  std::optional<double> degradedSeconds;
  std::optional<int64_t> rejoins;
  std::optional<int64_t> stateTransferBytes;
  std::optional<int64_t> rounds;
  std::optional<double> codecSeconds;
  std::optional<int64_t> peerRejoins;
  std::optional<int64_t> lateApplied;
  std::optional<int64_t> lateDropped;
  std::optional<int64_t> rejected;  // peer contributions refused before use
};

struct ByteCounts {  // cumulative totals
  std::optional<uint64_t> wanSent;
  std::optional<uint64_t> wanReceived;
  std::optional<uint64_t> lanSent;
  std::optional<uint64_t> lanReceived;
  std::optional<uint64_t> payload;  // fp32 size of what the synchronizer encoded
};

// Where a worker's training thread spent its steps so far (cumulative
// seconds, train::StepTiming): computing, and in the synchronizer, of which
// encoding and decoding (codec; of that, encoding this worker's updates:
// encode) and waiting for peers or the uplink (wait).
// Unlike sync.codecSeconds and sync.waitSeconds, only inside the steps: not
// a join's state transfer nor the final average.
struct StepTime {
  std::optional<int64_t> steps;
  std::optional<double> computeSeconds;
  std::optional<double> syncSeconds;
  std::optional<double> codecSeconds;
  std::optional<double> encodeSeconds;
  std::optional<double> waitSeconds;
};

struct WorkerEvent {
  EventKind kind = EventKind::kOther;
  std::string name;  // the "event" string as given

  std::optional<int64_t> rank;
  std::optional<double> time;  // seconds since the worker started
  // progress: when its step's training ended (seconds since the worker
  // started), before the evaluation the event may report
  std::optional<double> stepEndedAt;

  // start
  std::string region;
  std::optional<int64_t> localRank;
  std::optional<int64_t> worldSize;
  std::string model;
  std::optional<int64_t> parameters;
  std::optional<int64_t> shardSamples;
  std::optional<int64_t> steps;
  std::string algorithm;
  std::optional<int64_t> resumedAt;  // 0, or the step of the checkpoint resumed from

  // progress / done
  std::optional<int64_t> step;
  std::optional<int64_t> fromStep;     // joined: the worker's own step before joining
  std::optional<double> loss;          // written as null (+ nonFinite) when not finite
  std::vector<std::string> nonFinite;  // members that were no finite number ("loss")
  std::optional<double> lr;
  std::optional<double> samplesPerSecond;
  std::optional<double> evalAccuracy;  // 0..1, only on lines that report one (classification)
  std::optional<double> evalLoss;      // the test loss per sample, with every evaluation
  std::optional<int64_t> evalStep;     // the step evaluated (may be earlier)
  std::optional<double> evalAgeSeconds;
  std::optional<double> testAccuracy;  // done: the final (averaged) model (classification)
  std::optional<double> testLoss;      // done: the final model's test loss
  SyncStats sync;
  ByteCounts bytes;
  StepTime stepTime;

  std::optional<double> stepSecondsMax;
  // progress, done: the worker's peak resident memory so far (getrusage's
  // ru_maxrss), in bytes.
  std::optional<uint64_t> maxRssBytes;
  std::string modelHash;                // done
  std::optional<int64_t> joinedAt;      // done: the step it took when it joined a running job
  std::optional<bool> arrivedAfterEnd;  // done: the job had ended before it could rejoin

  // joined
  std::optional<bool> transferred;
  std::optional<bool> jobFinished;
  std::optional<double> stateTransferSeconds;

  // error
  std::string message;
  // error: the worker ends with kWorkerExitRejoin (common/exit_codes.h: its
  // region leader went away):
  // started again it rejoins, and its failure is not its own.
  std::optional<bool> rejoin;
};

// InvalidArgument when the line is not a JSON object with a string "event".
StatusOr<WorkerEvent> parseWorkerEvent(std::string_view line);

// The "event" name of a kind ("start", ...; "" for kOther).
std::string_view eventName(EventKind kind);

// One JSON line (without the newline) holding every member of `event` that
// is set: "event" is `name`, or eventName(kind) when `name` is empty. `sync`
// and `bytes` are written when one of their members is set. Never throws
// but on allocation failure.
std::string formatWorkerEvent(const WorkerEvent& event);

}  // namespace geo::local
