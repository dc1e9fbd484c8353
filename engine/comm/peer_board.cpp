#include "peer_board.h"

#include "error.h"

#include <chrono>

namespace zerod {

std::vector<PeerBoard::Post> PeerBoard::meet(int rank, const Post& mine, const std::string& what) {
  std::unique_lock<std::mutex> lock(mu_);
  if (failed_ != ZD_OK) fail(failed_, why_);
  const uint64_t k = next_[static_cast<size_t>(rank)]++;
  Meeting& m = meetings_[k];
  if (m.posts.empty()) {
    m.posts.resize(static_cast<size_t>(world_));
    m.arrived.assign(static_cast<size_t>(world_), 0);
    m.whats.resize(static_cast<size_t>(world_));
  }
  m.posts[static_cast<size_t>(rank)] = mine;
  m.arrived[static_cast<size_t>(rank)] = 1;
  m.whats[static_cast<size_t>(rank)] = what;
  ++m.count;
  cv_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  while (m.count < world_ && failed_ == ZD_OK) {
    if (timeout_s_ > 0) {
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && m.count < world_) {
        std::string missing;
        for (int r = 0; r < world_; ++r)
          if (!m.arrived[static_cast<size_t>(r)]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        failed_ = ZD_ERR_TIMEOUT;
        why_ = "rank " + std::to_string(rank) + " waited " + std::to_string(timeout_s_) + " s in \"" + what +
               "\" (device collective #" + std::to_string(k + 1) + ") for rank(s) " + missing +
               ", which never arrived (comm_timeout)";
        cv_.notify_all();
      }
    } else {
      cv_.wait(lock);
    }
  }
  if (failed_ != ZD_OK) fail(failed_, why_);
  // The same collective on every rank, or they went different ways.
  for (int r = 0; r < world_; ++r) {
    const Post& p = m.posts[static_cast<size_t>(r)];
    if (p.tag != mine.tag || p.count != mine.count) {
      failed_ = ZD_ERR_INVALID_STATE;
      const int lo = std::min(r, rank), hi = std::max(r, rank);
      why_ = "ranks disagree at device collective #" + std::to_string(k + 1) + ": rank " + std::to_string(lo) +
             " is in \"" + m.whats[static_cast<size_t>(lo)] + "\", rank " + std::to_string(hi) + " is in \"" +
             m.whats[static_cast<size_t>(hi)] + "\"";
      cv_.notify_all();
      fail(failed_, why_);
    }
  }
  std::vector<Post> out = m.posts;
  if (++m.taken == world_) meetings_.erase(k);
  return out;
}

void PeerBoard::abort(zd_status code, const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_ == ZD_OK) {
    failed_ = code;
    why_ = why;
  }
  cv_.notify_all();
}

void PeerBoard::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  meetings_.clear();
  std::fill(next_.begin(), next_.end(), 0);
  failed_ = ZD_OK;
  why_.clear();
}

}  // namespace zerod
