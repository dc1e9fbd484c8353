// `zerod top`: a live view of a running daemon, refreshed in place: every
// rank's step rate, step time, tokens per second, loss and state, its tiers
// filling, and where its time went since the last refresh. Plain ANSI
// escapes (home, clear to end of line and screen), so it works in any
// terminal and over ssh; piped, it prints one frame per refresh.
#include "commands.h"
#include "cli_args.h"

#include "error.h"
#include "observer.h"
#include "top/top_view.h"

#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace zerod::cli {

namespace {

volatile sig_atomic_t g_stop = 0;
void on_stop(int) { g_stop = 1; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int terminal_width() {
  winsize ws{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 120;
}

// The terminal as top leaves it: keys read one at a time without echo, the
// cursor hidden; restored however top ends.
class Screen {
 public:
  explicit Screen(bool tty) : tty_(tty) {
    if (!tty_) return;
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0) {
      termios raw = saved_;
      raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
      raw.c_cc[VMIN] = 0;
      raw.c_cc[VTIME] = 0;
      keys_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    std::fputs("\x1b[?25l\x1b[H\x1b[2J", stdout);
    std::fflush(stdout);
  }
  ~Screen() {
    if (!tty_) return;
    if (keys_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
    std::fputs("\x1b[?25h\n", stdout);
    std::fflush(stdout);
  }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;

  void show(const std::string& frame) {
    if (!tty_) {
      std::fputs(frame.c_str(), stdout);
      std::fputs("\n", stdout);
      std::fflush(stdout);
      return;
    }
    // Home, each line cleared to its end, the rest of the screen cleared:
    // no flicker from clearing the whole screen first.
    std::string out = "\x1b[H";
    size_t at = 0;
    while (at < frame.size()) {
      const size_t nl = frame.find('\n', at);
      out += frame.substr(at, nl - at) + "\x1b[K\r\n";
      if (nl == std::string::npos) break;
      at = nl + 1;
    }
    out += "\x1b[J";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }

  // Waits up to `seconds` for a key; true when it was q (or Q).
  bool quit_key(double seconds) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    const int ms = static_cast<int>(seconds * 1000);
    if (!keys_) {
      poll(nullptr, 0, ms);
      return false;
    }
    if (poll(&p, 1, ms) <= 0) return false;
    char c = 0;
    while (read(STDIN_FILENO, &c, 1) == 1)
      if (c == 'q' || c == 'Q') return true;
    return false;
  }

 private:
  bool tty_;
  bool keys_ = false;
  termios saved_{};
};

}  // namespace

int top_command(int argc, char** argv) {
  std::string socket;
  double interval = 1.0;
  bool once = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a == "--interval" && i + 1 < argc) {
      char* end = nullptr;
      interval = std::strtod(argv[++i], &end);
      if (*end || !(interval >= 0.1 && interval <= 3600)) {
        std::fprintf(stderr, "zerod top: --interval takes seconds from 0.1 to 3600, got '%s'\n", argv[i]);
        return 2;
      }
    } else if (a == "--once") {
      once = true;
    } else if (a == "-h" || a == "--help") {
      std::printf("usage: zerod top [--socket PATH] [--interval SECONDS] [--once]\n"
                  "  a live view of a running daemon; q or Ctrl-C quits\n"
                  "  PATH defaults to ZEROD_ENDPOINT's (unix:PATH), as `zerod run` sets it\n"
                  "  --interval  seconds between refreshes (default 1)\n"
                  "  --once      sample twice, one interval apart; print one frame (with the rates\n"
                  "              between the samples) and exit\n");
      return 0;
    } else {
      std::fprintf(stderr, "zerod top: %s\n", unexpected_argument(a, {"--socket", "--interval"}).c_str());
      return 2;
    }
  }
  socket = observed_socket(socket);
  if (socket.empty()) {
    std::fprintf(stderr, "zerod top: which daemon? give --socket PATH (zerod serve prints it)\n");
    return 2;
  }
  std::unique_ptr<Observer> observer;
  try {
    observer = std::make_unique<Observer>(socket);
  } catch (const Error& e) {
    std::fprintf(stderr, "zerod top: %s (%s)\n", e.what(), status_name(e.code()));
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop;  // no SA_RESTART: poll returns at once
  for (int s : {SIGINT, SIGTERM, SIGHUP}) sigaction(s, &sa, nullptr);

  const bool tty = !once && isatty(STDOUT_FILENO);
  std::string gone;
  {
    Screen screen(tty);
    top::Snapshot before;
    bool have_before = false;
    for (int frame = 0; !g_stop; ++frame) {
      v1::StatusReply st;
      try {
        st = observer->status();
      } catch (const Error& e) {
        gone = e.what();
        break;
      }
      const top::Snapshot now = top::snapshot(st, now_s());
      if (!once || frame == 1) screen.show(top::render_frame(st, now, have_before ? &before : nullptr, terminal_width()));
      before = now;
      have_before = true;
      if (once && frame == 1) break;
      if (screen.quit_key(interval)) break;
    }
  }
  if (!gone.empty()) {
    std::fprintf(stderr, "zerod top: the daemon at %s went away (%s)\n", socket.c_str(), gone.c_str());
  }
  return 0;
}

}  // namespace zerod::cli
