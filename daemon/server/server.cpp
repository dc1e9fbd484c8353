#include "server.h"

#include "session.h"

#include "error.h"
#include "log.h"
#include "transport/errors.h"

#include <unistd.h>

namespace zerod::server {

Server::Server(ServerOptions options)
    : options_(std::move(options)),
      listener_(transport::Listener::create_private(
          options_.socket_path, transport::ListenerOptions{options_.allow_uid, SOMAXCONN})),
      started_(std::chrono::steady_clock::now()),
      creates_() {
  if (options_.world_size < 1) fail(ZD_ERR_INVALID_ARGUMENT, "the daemon needs at least one rank");
  if (options_.local_ranks < 0) options_.local_ranks = options_.world_size - options_.first_rank;
  if (options_.first_rank < 0 || options_.local_ranks < 1 ||
      options_.first_rank + options_.local_ranks > options_.world_size)
    fail(ZD_ERR_INVALID_ARGUMENT, "the daemon's ranks " + std::to_string(options_.first_rank) + ".." +
                                      std::to_string(options_.first_rank + options_.local_ranks - 1) +
                                      " are outside the job's " + std::to_string(options_.world_size));
  creates_.assign(static_cast<size_t>(options_.local_ranks), 0);
}

Server::~Server() { stop(); }

void Server::start() {
  accept_thread_ = std::thread([this] { accept_loop(); });
}

void Server::accept_loop() {
  while (!stopping_.load()) {
    std::optional<transport::Connection> c;
    try {
      c = listener_.accept();
    } catch (const transport::PeerRefused& e) {
      log_warn(std::string("refused a connection: ") + e.what());
      continue;
    } catch (const Error& e) {
      log_warn(std::string("accept failed: ") + e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (!c) break;  // shut down
    auto s = std::make_shared<Session>(*this, std::move(*c));
    {
      std::lock_guard<std::mutex> lock(mu_);
      reap_finished();
      sessions_.push_back(s);
    }
    s->start();
  }
}

void Server::reap_finished() {
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if ((*it)->finished()) {
      (*it)->join();
      it = sessions_.erase(it);
    } else {
      ++it;
    }
  }
}

void Server::stop() {
  if (stopping_.exchange(true)) return;
  listener_.shutdown();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions.swap(sessions_);
  }
  // A session blocked in a collective is woken by its model's comm abort.
  for (auto& m : models())
    for (int r = first_rank(); r < first_rank() + local_ranks(); ++r)
      if (m->attached(r)) m->model().rank_lost(r, "the daemon is stopping");
  for (auto& s : sessions) s->stop();
  for (auto& s : sessions) s->join();
  std::lock_guard<std::mutex> lock(mu_);
  models_.clear();
}

bool Server::claim_rank(int rank, Session* s, std::string* holder) {
  // A rank that disconnected and connects again (a new zd_connect in the
  // same process, a restarted trainer) may arrive before its old session has
  // seen the EOF: give that session a moment to finish.
  std::unique_lock<std::mutex> lock(mu_);
  const auto free = [&] {
    auto it = rank_owner_.find(rank);
    return it == rank_owner_.end() || it->second->finished();
  };
  rank_freed_.wait_for(lock, std::chrono::milliseconds(options_.reclaim_wait_ms), free);
  if (!free()) {
    *holder = "pid " + std::to_string(rank_owner_[rank]->pid());
    return false;
  }
  rank_owner_[rank] = s;
  any_rank_came_ = true;
  return true;
}

bool Server::ranks_came_and_left() {
  std::lock_guard<std::mutex> lock(mu_);
  return any_rank_came_ && rank_owner_.empty();
}

bool Server::any_rank_came() {
  std::lock_guard<std::mutex> lock(mu_);
  return any_rank_came_;
}

void Server::release_rank(int rank, Session* s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = rank_owner_.find(rank);
    if (it != rank_owner_.end() && it->second == s) rank_owner_.erase(it);
  }
  rank_freed_.notify_all();
}

int Server::rank_pid(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = rank_owner_.find(rank);
  return it == rank_owner_.end() ? 0 : it->second->pid();
}

std::shared_ptr<ModelHost> Server::create_or_attach(int rank, const std::string& text,
                                                    const std::string& name, bool allow_io,
                                                    const std::string& device) {
  // A model another rank made for another device is not this rank's.
  auto same_device = [&](const ModelHost& m) {
    if (m.device_request() != device)
      fail(ZD_ERR_CONFIG, "rank " + std::to_string(rank) + " asks for its model on device \"" +
                              (device.empty() ? "(the job script's)" : device) + "\" but another rank created it on \"" +
                              (m.device_request().empty() ? "(the job script's)" : m.device_request()) +
                              "\"; every rank must pass the same zd_model_options.device");
  };
  std::unique_lock<std::mutex> lock(mu_);
  // A restarted rank of a job that keeps its state finds its old model.
  for (auto& [id, m] : models_) {
    if (m->script_text() == text && m->can_reattach(rank)) {
      same_device(*m);
      m->reattach(rank);
      log_info("rank " + std::to_string(rank) + " re-attached to model " + std::to_string(id) +
               " (kept for a restart)");
      return m;
    }
  }
  const uint64_t key = creates_.at(static_cast<size_t>(rank - first_rank()))++;
  for (auto& [id, m] : models_) {
    if (m->key() != key) continue;
    if (m->attached(rank)) continue;  // an old model of this key whose rank is still there
    if (m->script_text() != text)
      fail(ZD_ERR_CONFIG, "rank " + std::to_string(rank) + "'s job script " + name +
                              " differs from the " + m->script_name() +
                              " another rank created this model with; every rank must use the "
                              "same job script");
    same_device(*m);
    m->attach(rank);
    return m;
  }
  // The first rank to ask creates it. The script is loaded outside the lock
  // (it runs Lua and loads plugins); a second rank asking meanwhile waits.
  lock.unlock();
  scripting::ScriptSource src;
  src.text = text;
  src.name = name;
  src.allow_io = allow_io;
  auto script = scripting::JobScript::load(src);
  lock.lock();
  for (auto& [id, m] : models_)
    if (m->key() == key && !m->attached(rank)) {  // created while we loaded ours
      if (m->script_text() != text)
        fail(ZD_ERR_CONFIG, "rank " + std::to_string(rank) + "'s job script " + name +
                                " differs from the " + m->script_name() +
                                " another rank created this model with; every rank must use "
                                "the same job script");
      same_device(*m);
      m->attach(rank);
      return m;
    }
  auto m = std::make_shared<ModelHost>(next_model_id_++, key, text, name, std::move(script),
                                       options_.world_size, first_rank(), local_ranks(), options_.trace_path, device);
  m->attach(rank);
  models_[m->id()] = m;
  return m;
}

std::shared_ptr<ModelHost> Server::model(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = models_.find(id);
  return it == models_.end() ? nullptr : it->second;
}

void Server::forget_if_unused(const std::shared_ptr<ModelHost>& m) {
  if (m->anyone_attached()) return;
  if (options_.keep_state || m->model().config().keep_state_on_disconnect) return;
  std::lock_guard<std::mutex> lock(mu_);
  models_.erase(m->id());
}

std::vector<std::shared_ptr<ModelHost>> Server::models() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<ModelHost>> out;
  for (auto& [id, m] : models_) out.push_back(m);
  return out;
}

double Server::uptime_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void Server::rank_exited(int rank, const std::string& how) {
  for (auto& m : models())
    if (m->attached(rank)) m->detach(rank, true, how);
}

}  // namespace zerod::server
