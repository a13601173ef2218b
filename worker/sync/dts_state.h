#pragma once
// DTS's checkpointed state (Synchronizer::saveState and loadState): what a
// worker writes into its checkpoint so that, started again from it, it
// takes up its rounds in flight -- the round's start, its schedule, the
// rounds it closed and has not completed, the ones it completed last -- and
// the archive's format, with the older formats it still reads. Dts turns its
// own state into a DtsState and back (dts.cc); this file knows nothing of
// the rounds' protocol.
//
// Header-only: one more LibTorch translation unit costs the build ~20 s;
// dts.cc and the tests include it.

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "worker/sync/exchange_choice.h"

namespace geo::sync::detail {

// A round this worker closed and has not completed.
struct DtsSavedRound {
  uint64_t round = 0;
  int64_t sendStep = 0;
  int64_t dueStep = 0;
  // This worker's contribution, encoded (as its peers receive it).
  std::shared_ptr<const std::vector<std::byte>> bytes;
  bool provisionalDue = false;  // closed before the links were known
  torch::Tensor start;          // D = 0 with the identity codec; else undefined
  // D = auto: the contributions applied as they arrived (by group index;
  // empty: none), Σ w_j q_j over them, and Σ w_j.
  std::vector<bool> early;
  torch::Tensor earlySum;
  double earlyWeight = 0;
};

// A round completed last: this worker's contribution, which a peer that
// has not completed it may still need (sent again after a restart).
struct DtsSentRound {
  uint64_t round = 0;
  int64_t sendStep = 0;
  std::shared_ptr<const std::vector<std::byte>> bytes;
};

struct DtsState {
  // The round's start: x at the last round's close plus the corrections
  // applied since, plus what error feedback has yet to send.
  torch::Tensor base;
  int64_t jobStep = 0;  // the step of the job's model (the last completion's)
  uint64_t nextRound = 0;
  int64_t delay = 0;
  // nullopt: the checkpoint predates a period that can change (every round
  // is of the configured K).
  std::optional<DtsSchedule> schedule;
  std::optional<DtsSchedule> nextSchedule;  // a change decided, not in force yet
  std::vector<DtsSentRound> sent;
  std::vector<DtsSavedRound> pending;
};

namespace dts_state_detail {

// A payload as the archive holds it (uint8), and back.
inline torch::Tensor bytesTensor(const std::vector<std::byte>& bytes) {
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return t;
}
inline std::shared_ptr<const std::vector<std::byte>> bytesOf(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  auto buffer = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(c.numel()));
  std::memcpy(buffer->data(), c.data_ptr<uint8_t>(), buffer->size());
  return buffer;
}
inline torch::Tensor scheduleTensor(const DtsSchedule& e) {
  return torch::tensor(
      {static_cast<int64_t>(e.round), e.step, e.k, static_cast<int64_t>(e.exchange)});
}
// Older checkpoints hold three values (no exchange: all-gather; Dts puts a
// fixed sync.exchange in its place).
inline DtsSchedule scheduleOf(const torch::Tensor& v) {
  DtsSchedule e{static_cast<uint64_t>(v[0].item<int64_t>()), v[1].item<int64_t>(),
                std::max<int64_t>(1, v[2].item<int64_t>())};
  if (v.numel() > 3 && v[3].item<int64_t>() == static_cast<int64_t>(Exchange::kReduceScatter)) {
    e.exchange = Exchange::kReduceScatter;
  }
  return e;
}

}  // namespace dts_state_detail

// Writes `s` under the keys "dts_*". The archive's format: these keys,
// their shapes, and what readDtsState still reads of older ones.
inline void writeDtsState(torch::serialize::OutputArchive& archive, const DtsState& s) {
  using namespace dts_state_detail;
  archive.write("dts_base", s.base);
  archive.write("dts_job_step", torch::tensor(s.jobStep));
  archive.write("dts_next_round", torch::tensor(static_cast<int64_t>(s.nextRound)));
  archive.write("dts_delay", torch::tensor(s.delay));
  if (s.schedule) archive.write("dts_schedule", scheduleTensor(*s.schedule));
  if (s.nextSchedule) archive.write("dts_next_schedule", scheduleTensor(*s.nextSchedule));
  archive.write("dts_sent", torch::tensor(static_cast<int64_t>(s.sent.size())));
  for (size_t i = 0; i < s.sent.size(); ++i) {
    const auto prefix = fmt::format("dts_sent_{}_", i);
    archive.write(prefix + "meta",
                  torch::tensor({static_cast<int64_t>(s.sent[i].round), s.sent[i].sendStep}));
    archive.write(prefix + "bytes", bytesTensor(*s.sent[i].bytes));
  }
  archive.write("dts_pending", torch::tensor(static_cast<int64_t>(s.pending.size())));
  for (size_t i = 0; i < s.pending.size(); ++i) {
    const DtsSavedRound& p = s.pending[i];
    const auto prefix = fmt::format("dts_pending_{}_", i);
    archive.write(prefix + "meta",
                  torch::tensor({static_cast<int64_t>(p.round), p.sendStep, p.dueStep}));
    archive.write(prefix + "bytes", bytesTensor(*p.bytes));
    if (p.provisionalDue) archive.write(prefix + "provisional_due", torch::tensor(int64_t{1}));
    if (p.start.defined()) archive.write(prefix + "start", p.start);
    if (!p.early.empty()) {
      archive.write(prefix + "early_sum", p.earlySum);
      auto early = torch::zeros({static_cast<int64_t>(p.early.size())}, torch::kUInt8);
      for (size_t j = 0; j < p.early.size(); ++j) early[static_cast<int64_t>(j)] = p.early[j];
      archive.write(prefix + "early", early);
      archive.write(prefix + "early_weight", torch::tensor(p.earlyWeight, torch::kFloat64));
    }
  }
}

// The state writeDtsState wrote, or nullopt where the archive holds none (a
// checkpoint saved before the first step). Older formats: a residual kept
// apart from the round's start ("dts_residual") is added to it; no job step
// reads as 0 (the first completion sets it); no schedule as nullopt; no
// rounds completed last as none (a peer then completes those without this
// worker's part). Contributions applied early whose record is not one flag
// per member of a group of `groupSize` are dropped (the round completes
// them again). Throws (c10::Error) where a key every format has is missing.
inline std::optional<DtsState> readDtsState(torch::serialize::InputArchive& archive,
                                            size_t groupSize) {
  using namespace dts_state_detail;
  DtsState s;
  if (!archive.try_read("dts_base", s.base)) return std::nullopt;
  s.base = s.base.contiguous();
  if (torch::Tensor residual; archive.try_read("dts_residual", residual)) {
    s.base.add_(residual.to(s.base.device()).view_as(s.base));
  }
  torch::Tensor v;
  s.jobStep = archive.try_read("dts_job_step", v) ? v.item<int64_t>() : 0;
  archive.read("dts_next_round", v);
  s.nextRound = static_cast<uint64_t>(v.item<int64_t>());
  archive.read("dts_delay", v);
  s.delay = v.item<int64_t>();
  if (archive.try_read("dts_schedule", v)) s.schedule = scheduleOf(v);
  if (archive.try_read("dts_next_schedule", v)) s.nextSchedule = scheduleOf(v);
  if (archive.try_read("dts_sent", v)) {
    for (int64_t i = 0; i < v.item<int64_t>(); ++i) {
      const auto prefix = fmt::format("dts_sent_{}_", i);
      torch::Tensor meta, bytes;
      archive.read(prefix + "meta", meta);
      archive.read(prefix + "bytes", bytes);
      s.sent.push_back({static_cast<uint64_t>(meta[0].item<int64_t>()), meta[1].item<int64_t>(),
                        bytesOf(bytes)});
    }
  }
  archive.read("dts_pending", v);
  for (int64_t i = 0; i < v.item<int64_t>(); ++i) {
    const auto prefix = fmt::format("dts_pending_{}_", i);
    DtsSavedRound p;
    torch::Tensor meta, bytes;
    archive.read(prefix + "meta", meta);
    p.round = static_cast<uint64_t>(meta[0].item<int64_t>());
    p.sendStep = meta[1].item<int64_t>();
    p.dueStep = meta[2].item<int64_t>();
    // Checkpoints written while a round kept its own contribution decoded
    // hold it as "own": the bytes say the same.
    archive.read(prefix + "bytes", bytes);
    p.bytes = bytesOf(bytes);
    torch::Tensor provisional;
    p.provisionalDue = archive.try_read(prefix + "provisional_due", provisional);
    torch::Tensor start;
    if (archive.try_read(prefix + "start", start)) p.start = start.contiguous();
    torch::Tensor earlySum, early, earlyWeight;
    if (archive.try_read(prefix + "early_sum", earlySum) &&
        archive.try_read(prefix + "early", early) &&
        archive.try_read(prefix + "early_weight", earlyWeight) &&
        early.numel() == static_cast<int64_t>(groupSize)) {
      p.earlySum = earlySum.contiguous();
      p.early.resize(groupSize);
      for (size_t j = 0; j < groupSize; ++j) {
        p.early[j] = early[static_cast<int64_t>(j)].item<uint8_t>() != 0;
      }
      p.earlyWeight = earlyWeight.item<double>();
    }
    s.pending.push_back(std::move(p));
  }
  return s;
}

}  // namespace geo::sync::detail
