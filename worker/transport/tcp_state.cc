#include "worker/transport/tcp_state.h"

// linux/tcp.h's tcp_info carries the fields glibc's netinet/tcp.h lacks
// (tcpi_notsent_bytes); the two headers cannot be included together.
#include <arpa/inet.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace geo::transport {

std::optional<TcpProgress> tcpProgress(int fd, uint16_t peerPort) {
  if (fd < 0) return std::nullopt;
  sockaddr_storage peer{};
  socklen_t len = sizeof peer;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return std::nullopt;
  uint16_t port = 0;
  if (peer.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&peer)->sin_port);
  } else if (peer.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&peer)->sin6_port);
  } else {
    return std::nullopt;
  }
  if (peerPort != 0 && port != peerPort) return std::nullopt;
  tcp_info info{};
  len = sizeof info;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return std::nullopt;
  // An older kernel fills a shorter structure: without tcpi_notsent_bytes
  // what is not sent yet is unknown, and "nothing outstanding" cannot be
  // told.
  if (len < offsetof(tcp_info, tcpi_notsent_bytes) + sizeof info.tcpi_notsent_bytes) {
    return std::nullopt;
  }
  TcpProgress p;
  // TCP_ESTABLISHED (netinet/tcp.h, linux/tcp_states.h): 1.
  p.established = info.tcpi_state == 1;
  p.unackedSegments = info.tcpi_unacked;
  p.notSentBytes = info.tcpi_notsent_bytes;
  p.sinceAckSeconds = info.tcpi_last_ack_recv * 1e-3;
  p.sinceSendSeconds = info.tcpi_last_data_sent * 1e-3;
  p.backoff = info.tcpi_backoff;
  p.rtoSeconds = info.tcpi_rto * 1e-6;
  if (len >= offsetof(tcp_info, tcpi_bytes_acked) + sizeof info.tcpi_bytes_acked) {
    p.bytesAcked = info.tcpi_bytes_acked;
    p.countsBytes = true;
  }
  p.sendMss = info.tcpi_snd_mss;
  return p;
}

uint64_t queuedAheadBytes(const TcpProgress& p, uint64_t handedBytes) {
  if (!p.countsBytes) return 0;
  const uint64_t gone = p.bytesAcked + uint64_t{p.unackedSegments} * p.sendMss;
  return handedBytes > gone ? handedBytes - gone : 0;
}

bool retransmitsSoon(const TcpProgress& k, double ackWithinSeconds, double retryWithinSeconds) {
  return k.outstanding() && k.sinceAckSeconds < ackWithinSeconds &&
         k.retryInSeconds() < retryWithinSeconds;
}

bool dataVouchesThroughSilence(const TcpProgress& data, double boundSeconds) {
  return data.sinceAckSeconds < boundSeconds ||
         (data.backoff <= 1 && retransmitsSoon(data, 4 * boundSeconds, 2 * boundSeconds));
}

bool probeVouchesThroughSilence(const TcpProgress& probe, double boundSeconds) {
  return probe.sinceAckSeconds < boundSeconds ||
         retransmitsSoon(probe, 2 * boundSeconds, 2 * boundSeconds);
}

}  // namespace geo::transport
