#pragma once
// The worker's transport, from its configuration: what worker.yaml's
// transport.* and sync.* keys mean for the ZeroMQ mesh. No LibTorch.
//
// The schema (common/worker_config.h) checks each key on its own; the checks
// here need several keys at once or files: link keys that must name two
// regions of this job, link and uplink profiles, and the CURVE key files of
// every rank. Errors name the key and the value (transport.links.a-b: ...).

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/worker_config.h"
#include "worker/transport/zmq_transport.h"

namespace geo::app {

// regions[r]: rank r's region: transport.regions, or worker.region for every
// rank of worker.worldSize when transport.regions is empty.
std::vector<std::string> rankRegions(const WorkerConfig& config);

// The settings every worker of a job must share, as the transport's
// agreedSettings text ("key = value" lines, worker.yaml's names): the
// algorithm and what shapes its rounds (sync.period and sync.delay under
// dts, sync.swarmH under swarm), the codec and its wire format (sync.bits and
// sync.bucket under qsgd), and the hierarchy (sync.hierarchical, and
// sync.lanCodec under it). Settings a worker may choose alone (time-outs,
// error feedback, threads) are not in it.
std::string agreedSyncSettings(const WorkerConfig& config);

// The transport of worker `rank` of a job of several workers: endpoints
// (transport.peers, `none` never connected to), the bind endpoint, CURVE keys
// from transport.keyDir (worker-<rank>.key, every worker-<r>.pub), the
// emulated links to the ranks of other regions (transport.links,
// transport.uplink), region names for messages and agreedSyncSettings.
// onDisagreement is left for the caller. InvalidArgument naming the key for
// a check the schema cannot make; the key loader's Status for a key file.
StatusOr<transport::TransportConfig> transportConfig(const WorkerConfig& config, uint32_t rank);

// transport.tcpInitialWindow: the initial TCP windows toward every WAN peer
// (another region's rank with an endpoint in transport.peers), by host
// routes (transport/initial_window.h), each logged; routes that carry them
// already are left as they are. Nothing at 0. Its Status, in the key's
// name: a missing CAP_NET_ADMIN, a peer that does not resolve. Needs no
// keys: a privileged init container runs it alone
// (geotrain-worker --tcp-initial-window-only).
Status applyTcpInitialWindow(const WorkerConfig& config);

// The CURVE keys in transport.keyDir for worker `rank` (docs/security.md,
// "Rotating keys"): its secret key (worker-<rank>.key), and every rank's
// public keys -- worker-<r>.pub, then worker-<r>.next.pub and
// worker-<r>.previous.pub where a rotation has them. This worker's own list
// starts with the public key of its secret key, whichever file holds it.
// The key loader's Status for a file that is missing (the first two) or
// not one key; InvalidArgument when the secret key is none of its
// public keys'.
StatusOr<transport::KeySet> loadKeySet(const WorkerConfig& config, uint32_t rank);

}  // namespace geo::app
