#include "worker/wan/wan_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/enforce.h"

namespace geo::wan {

namespace {

SteadyClock::duration transmission(size_t bytes, double bitsPerSecond) {
  return std::chrono::duration_cast<SteadyClock::duration>(
      std::chrono::duration<double>(static_cast<double>(bytes) * 8.0 / bitsPerSecond));
}

Status checkRate(double rate, const std::string& what) {
  if (!std::isfinite(rate) || rate < 0) {
    return invalidArgument(
        fmt::format("{}: {} bit/s is not allowed (0: unlimited, or a rate > 0)", what, rate));
  }
  return {};
}

}  // namespace

const char* fateName(Fate fate) {
  switch (fate) {
    case Fate::kDelivered: return "delivered";
    case Fate::kLost: return "lost";
    case Fate::kQueueFull: return "queue full";
    case Fate::kPartitioned: return "partitioned";
  }
  return "unknown";
}

Status validateShape(const WanShape& shape) {
  const size_t n = shape.size();
  if (n == 0) return invalidArgument("the WAN has no sites");
  if (shape.oneWay.size() != n || shape.site.size() != n) {
    return invalidArgument(
        fmt::format("the WAN has {} sites but {} rows of delays and {} site shapes", n,
                    shape.oneWay.size(), shape.site.size()));
  }
  for (size_t s = 0; s < n; ++s) {
    if (shape.oneWay[s].size() != n) {
      return invalidArgument(fmt::format("site {}: {} delays for {} sites", shape.sites[s],
                                         shape.oneWay[s].size(), n));
    }
    for (size_t d = 0; d < n; ++d) {
      if (shape.oneWay[s][d].count() < 0) {
        return invalidArgument(fmt::format("{} -> {}: a negative delay ({} us)", shape.sites[s],
                                           shape.sites[d], shape.oneWay[s][d].count()));
      }
    }
    const SiteShape& site = shape.site[s];
    GEO_RETURN_IF_ERROR(checkRate(site.egressBitsPerSecond, shape.sites[s] + " egress"));
    GEO_RETURN_IF_ERROR(checkRate(site.ingressBitsPerSecond, shape.sites[s] + " ingress"));
    if (site.queue.count() < 0) {
      return invalidArgument(fmt::format("{}: a negative queue limit", shape.sites[s]));
    }
    if (!(site.loss >= 0 && site.loss < 1)) {
      return invalidArgument(
          fmt::format("{}: loss {} is not allowed (a probability from 0 up to, not including, 1)",
                      shape.sites[s], site.loss));
    }
  }
  if (shape.jitter.count() < 0) return invalidArgument("a negative jitter");
  return {};
}

std::optional<SteadyClock::time_point> WanModel::Serializer::pass(size_t bytes,
                                                                  double bitsPerSecond,
                                                                  Microseconds queue,
                                                                  SteadyClock::time_point now) {
  if (bitsPerSecond <= 0) return now;
  const SteadyClock::time_point start = std::max(now, nextFree);
  if (start - now > queue) return std::nullopt;  // the buffer is full: tail drop
  nextFree = start + transmission(bytes, bitsPerSecond);
  return nextFree;
}

WanModel::WanModel(WanShape shape)
    : shape_(std::move(shape)),
      cut_(shape_.size(), false),
      cutLink_(shape_.size(), std::vector<bool>(shape_.size(), false)),
      egress_(shape_.size()),
      ingress_(shape_.size()),
      lastArrival_(shape_.size(), std::vector<SteadyClock::time_point>(shape_.size())),
      counters_(shape_.size()),
      random_(shape_.seed) {
  const Status valid = validateShape(shape_);
  GEO_ENFORCE(valid.ok(), "{}", valid.message());
}

WanModel::Answer WanModel::send(size_t src, size_t dst, size_t bytes, SteadyClock::time_point now) {
  GEO_ENFORCE(src < shape_.size() && dst < shape_.size() && src != dst, "two different sites");
  SiteCounters& c = counters_[src];
  ++c.packetsSent;
  c.bytesSent += bytes;
  if (severed(src, dst)) {
    ++c.partitioned;
    return {Fate::kPartitioned, now};
  }
  const SiteShape& site = shape_.site[src];
  if (site.loss > 0 && std::uniform_real_distribution<double>(0, 1)(random_) < site.loss) {
    ++c.lost;
    return {Fate::kLost, now};
  }
  const auto left = egress_[src].pass(bytes, site.egressBitsPerSecond, site.queue, now);
  if (!left) {
    ++c.egressDropped;
    return {Fate::kQueueFull, now};
  }
  SteadyClock::duration delay = shape_.oneWay[src][dst];
  if (shape_.jitter.count() > 0) {
    delay += std::chrono::duration_cast<SteadyClock::duration>(
        std::chrono::duration<double, std::micro>(std::uniform_real_distribution<double>(
            0, static_cast<double>(shape_.jitter.count()))(random_)));
  }
  SteadyClock::time_point& last = lastArrival_[src][dst];
  last = std::max(last, *left + delay);
  return {Fate::kDelivered, last};
}

WanModel::Answer WanModel::arrive(size_t src, size_t dst, size_t bytes,
                                  SteadyClock::time_point now) {
  GEO_ENFORCE(src < shape_.size() && dst < shape_.size() && src != dst, "two different sites");
  if (severed(src, dst)) {
    ++counters_[src].partitioned;
    return {Fate::kPartitioned, now};
  }
  const SiteShape& site = shape_.site[dst];
  const auto in = ingress_[dst].pass(bytes, site.ingressBitsPerSecond, site.queue, now);
  if (!in) {
    ++counters_[dst].ingressDropped;
    return {Fate::kQueueFull, now};
  }
  ++counters_[dst].packetsDelivered;
  counters_[dst].bytesDelivered += bytes;
  return {Fate::kDelivered, *in};
}

void WanModel::setPartitioned(size_t site, bool cut) {
  GEO_ENFORCE(site < shape_.size(), "a site of the WAN");
  cut_[site] = cut;
}

void WanModel::setLinkCut(size_t a, size_t b, bool cut) {
  GEO_ENFORCE(a < shape_.size() && b < shape_.size() && a != b, "two different sites");
  cutLink_[a][b] = cut;
  cutLink_[b][a] = cut;
}

void WanModel::setEgressRate(size_t site, double bitsPerSecond) {
  GEO_ENFORCE(site < shape_.size(), "a site of the WAN");
  GEO_ENFORCE(std::isfinite(bitsPerSecond) && bitsPerSecond >= 0, "a rate >= 0");
  shape_.site[site].egressBitsPerSecond = bitsPerSecond;
}

void WanModel::setIngressRate(size_t site, double bitsPerSecond) {
  GEO_ENFORCE(site < shape_.size(), "a site of the WAN");
  GEO_ENFORCE(std::isfinite(bitsPerSecond) && bitsPerSecond >= 0, "a rate >= 0");
  shape_.site[site].ingressBitsPerSecond = bitsPerSecond;
}

}  // namespace geo::wan
