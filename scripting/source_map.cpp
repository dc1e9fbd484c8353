#include "source_map.h"

#include <cctype>

namespace zerod::scripting {

namespace {

enum class Tok { Name, String, Other, Eof };

struct Token {
  Tok kind = Tok::Eof;
  std::string text;  // name, string contents, or the operator
  int line = 0;
};

class Lexer {
 public:
  explicit Lexer(const std::string& s) : s_(s) {}

  Token next() {
    skip_space_and_comments();
    Token t;
    t.line = line_;
    if (i_ >= s_.size()) return t;
    const char c = s_[i_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i_;
      while (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) ++j;
      t.kind = Tok::Name;
      t.text = s_.substr(i_, j - i_);
      i_ = j;
      return t;
    }
    if (c == '"' || c == '\'') {
      t.kind = Tok::String;
      t.text = quoted(c);
      return t;
    }
    if (c == '[') {
      const size_t level = long_bracket_level(i_);
      if (level != npos) {
        t.kind = Tok::String;
        t.text = long_string(level);
        return t;
      }
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' ||
                                ((s_[i_] == '+' || s_[i_] == '-') &&
                                 (s_[i_ - 1] == 'e' || s_[i_ - 1] == 'E' || s_[i_ - 1] == 'p' ||
                                  s_[i_ - 1] == 'P'))))
        ++i_;
      t.kind = Tok::Other;
      t.text = "0";
      return t;
    }
    // Two-character operators that matter here: '==' must not read as '='.
    t.kind = Tok::Other;
    if (i_ + 1 < s_.size() && (c == '=' || c == '~' || c == '<' || c == '>') && s_[i_ + 1] == '=') {
      t.text = s_.substr(i_, 2);
      i_ += 2;
    } else {
      t.text = std::string(1, c);
      ++i_;
    }
    return t;
  }

 private:
  static constexpr size_t npos = static_cast<size_t>(-1);

  void skip_space_and_comments() {
    for (;;) {
      while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) {
        if (s_[i_] == '\n') ++line_;
        ++i_;
      }
      if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] == '-') {
        i_ += 2;
        const size_t level = i_ < s_.size() && s_[i_] == '[' ? long_bracket_level(i_) : npos;
        if (level != npos) {
          long_string(level);
        } else {
          while (i_ < s_.size() && s_[i_] != '\n') ++i_;
        }
        continue;
      }
      if (line_ == 1 && i_ == 0 && s_.size() > 1 && s_[0] == '#') {  // shebang line
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
        continue;
      }
      return;
    }
  }

  // "[[" or "[==[" at pos: the number of '='; npos if not a long bracket.
  size_t long_bracket_level(size_t pos) const {
    size_t j = pos + 1, level = 0;
    while (j < s_.size() && s_[j] == '=') ++j, ++level;
    return j < s_.size() && s_[j] == '[' ? level : npos;
  }

  std::string long_string(size_t level) {
    i_ += level + 2;
    const std::string close = "]" + std::string(level, '=') + "]";
    const size_t end = s_.find(close, i_);
    const size_t stop = end == std::string::npos ? s_.size() : end;
    std::string body = s_.substr(i_, stop - i_);
    for (char ch : body)
      if (ch == '\n') ++line_;
    i_ = end == std::string::npos ? s_.size() : end + close.size();
    return body;
  }

  std::string quoted(char q) {
    std::string out;
    ++i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) {
        if (s_[i_ + 1] == '\n') ++line_;
        out += s_[i_ + 1];
        i_ += 2;
        continue;
      }
      if (s_[i_] == '\n') ++line_;  // unterminated string: keep counting
      out += s_[i_++];
    }
    ++i_;
    return out;
  }

  const std::string& s_;
  size_t i_ = 0;
  int line_ = 1;
};

struct Frame {
  bool table;        // a table constructor (else a code block: function/if/do/repeat)
  std::string path;  // dotted path of a table constructor
};

}  // namespace

SourceMap::SourceMap(const std::string& text) {
  Lexer lex(text);
  std::vector<Frame> stack;
  std::vector<Token> window;  // the last few tokens, to see `name =` and `[str] =`
  std::string pending_key;    // key of the field whose value is being read
  auto top_is_table = [&] { return !stack.empty() && stack.back().table; };
  auto join = [](const std::string& a, const std::string& b) { return a.empty() ? b : a + "." + b; };

  for (Token t = lex.next(); t.kind != Tok::Eof; t = lex.next()) {
    if (t.kind == Tok::Name) {
      if (t.text == "function" || t.text == "if" || t.text == "do" || t.text == "repeat") {
        stack.push_back({false, ""});
      } else if ((t.text == "end" || t.text == "until") && !stack.empty() && !stack.back().table) {
        stack.pop_back();
      } else if (t.text == "return" && stack.empty()) {
        return_line_ = t.line;
      }
    }
    if (t.kind == Tok::Other && t.text == "=" && top_is_table() && !window.empty()) {
      const size_t n = window.size();
      std::string key;
      int line = 0;
      if (window[n - 1].kind == Tok::Name) {
        // `name =` directly inside a constructor: after '{', ',' or ';'.
        if (n < 2 || window[n - 2].text == "{" || window[n - 2].text == "," ||
            window[n - 2].text == ";") {
          key = window[n - 1].text;
          line = window[n - 1].line;
        }
      } else if (n >= 3 && window[n - 1].text == "]" && window[n - 2].kind == Tok::String &&
                 window[n - 3].text == "[") {
        key = window[n - 2].text;
        line = window[n - 2].line;
      }
      if (!key.empty()) {
        const std::string path = join(stack.back().path, key);
        fields_.push_back({path, line});
        pending_key = path;
      }
    }
    if (t.kind == Tok::Other && t.text == "{") {
      // Named when it is the value of a field just recorded: `key = {`.
      const bool named = !window.empty() && window.back().text == "=" && !pending_key.empty() &&
                         top_is_table();
      stack.push_back({true, named ? pending_key : ""});
    } else if (t.kind == Tok::Other && t.text == "}" && top_is_table()) {
      stack.pop_back();
    }
    if (t.kind == Tok::Other && (t.text == "," || t.text == ";")) pending_key.clear();
    window.push_back(t);
    if (window.size() > 4) window.erase(window.begin());
  }
}

int SourceMap::line_of(const std::string& path) const {
  // The longest recorded path that is a dotted suffix of `path`; the first
  // written wins among equals.
  int best_line = 0;
  size_t best_len = 0;
  for (const Field& f : fields_) {
    if (f.path.size() > path.size() || f.path.size() <= best_len) continue;
    const size_t off = path.size() - f.path.size();
    if (path.compare(off, std::string::npos, f.path) != 0) continue;
    if (off != 0 && path[off - 1] != '.') continue;
    best_len = f.path.size();
    best_line = f.line;
  }
  return best_line;
}

}  // namespace zerod::scripting
