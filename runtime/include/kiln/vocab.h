/* A character-level vocabulary for text in and out of a compiled model (header-only C++).
 *
 * File format: one token per line, UTF-8; the line number (from 0) is the token's id. A
 * token is one character, or "▁" (U+2581) for the space character, or a special token in
 * angle brackets such as <pad>, <s>, </s> (never produced from text; left out of decoded
 * text). Example: examples/numbers/vocab.src.txt.
 *
 * What is refused, each with the file and line (std::runtime_error): a token that is not
 * valid UTF-8, empty, neither one character nor <special>, or given twice; a line longer
 * than kMaxTokenBytes; more than kMaxVocabularyTokens lines; an empty or unreadable file.
 * An endless file (/dev/zero, `yes`) is refused after reading at most these limits. Text
 * quoted in a message is cut to its first characters and its length (quote()).
 *
 * A vocabulary belongs to a model: check_model() refuses one whose size is not the model's
 * (src_vocab, tgt_vocab) or whose special tokens are not at the model's pad_id, bos_id and
 * eos_id (e.g. the source and target files swapped, or one shifted by a line).
 */
#ifndef KILN_VOCAB_H_
#define KILN_VOCAB_H_

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <istream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/runtime.h"

namespace kiln {

/* Limits on what text input may hold (kiln translate and Vocabulary::load). */
constexpr size_t kMaxTokenBytes = 4096;               /* a vocabulary line */
constexpr int64_t kMaxVocabularyTokens = 1 << 20;     /* lines of a vocabulary (Unicode assigns
                                                       * about 150,000 characters) */
constexpr size_t kMaxSentenceBytes = size_t{1} << 20; /* a sentence to translate (1 MiB) */

/* The offset of the first byte of `text` that does not belong to a well-formed UTF-8
 * character (an overlong form, a surrogate or a code point above U+10FFFF included), or
 * std::string_view::npos when `text` is valid UTF-8. */
inline size_t invalid_utf8_at(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t n = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + n > text.size()) return i;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char b = static_cast<unsigned char>(text[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return i;
    }
    i += n;
  }
  return std::string_view::npos;
}

/* `text` quoted for a message: 'text' when it is at most 48 bytes, else its first 40 bytes
 * or a little less (cut at a character boundary), "..." and its length in bytes: 'three
 * hundred...' (1200000 bytes). Control characters and bytes that are not UTF-8 are written
 * \xNN, so a message stays one printable line. */
inline std::string quote(std::string_view text);
/* The start of `text`, whose end is not known (a line longer than a limit), quoted the same
 * way without a length: 'three hundred...'. */
inline std::string quote_start(std::string_view text);

namespace detail {
inline std::string quoted(std::string_view text, size_t limit, bool cut) {
  std::string out = "'";
  for (size_t i = 0; i < limit && i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {  // a whole, valid character, or one byte written \xNN
      const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (i + n <= text.size() && invalid_utf8_at(text.substr(i, n)) == std::string_view::npos) {
        if (i + n > limit) break;  // the cut would split it
        out.append(text.substr(i, n));
        i += n;
        continue;
      }
    }
    if (c < 0x20 || c == 0x7F || c >= 0x80) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  return out + (cut ? "...'" : "'");
}

// One line through `next()` (a byte, or EOF); see read_line.
template <typename Next>
int read_line_with(Next next, std::string& line, size_t max_bytes) {
  line.clear();
  bool any = false;
  for (int c; (c = next()) != EOF;) {
    any = true;
    if (c == '\n') break;
    line.push_back(static_cast<char>(c));
    if (line.size() > max_bytes) return -1;
  }
  if (!line.empty() && line.back() == '\r') line.pop_back();
  return any ? 1 : 0;
}
}  // namespace detail

inline std::string quote(std::string_view text) {
  if (text.size() <= 48) return detail::quoted(text, text.size(), false);
  return detail::quoted(text, 40, true) + " (" + std::to_string(text.size()) + " bytes)";
}

inline std::string quote_start(std::string_view text) {
  return detail::quoted(text, 40, text.size() > 40);
}

/* Reads one line into `line`, without its '\n' and a '\r' before it, reading at most
 * max_bytes + 1 bytes of it. Returns 1 for a line, 0 at the end of the input (nothing read),
 * -1 for a line longer than max_bytes (`line` then holds its first max_bytes + 1 bytes; the
 * rest is left unread). A read error ends the input (check ferror or the stream). */
inline int read_line(std::FILE* in, std::string& line, size_t max_bytes) {
  return detail::read_line_with([in] { return std::getc(in); }, line, max_bytes);
}
inline int read_line(std::istream& in, std::string& line, size_t max_bytes) {
  std::streambuf* sb = in.rdbuf();
  const int got = detail::read_line_with(
      [&] {
        const auto c = sb ? sb->sbumpc() : std::char_traits<char>::eof();
        if (c == std::char_traits<char>::eof()) {
          in.setstate(std::ios::eofbit);
          return EOF;
        }
        return static_cast<int>(static_cast<unsigned char>(c));
      },
      line, max_bytes);
  return got;
}

class Vocabulary {
 public:
  /* Reads a vocabulary file; throws std::runtime_error naming the file and line. */
  static Vocabulary load(const std::string& path) {
    std::FILE* in = std::fopen(path.c_str(), "rb");
    if (!in) throw std::runtime_error("cannot read vocabulary '" + path + "': " + errno_text());
    struct Closer {
      std::FILE* f;
      ~Closer() { std::fclose(f); }
    } closer{in};
    Vocabulary v;
    std::string line;
    for (int64_t id = 0;; ++id) {
      const std::string where = path + ":" + std::to_string(id + 1) + ": ";
      const int got = read_line(in, line, kMaxTokenBytes);
      if (got == 0) break;
      if (got < 0)
        throw std::runtime_error(where + "line is longer than " + std::to_string(kMaxTokenBytes) +
                                 " bytes (the limit for a token): " + quote_start(line));
      if (id == kMaxVocabularyTokens)
        throw std::runtime_error("vocabulary '" + path + "' has more than " +
                                 std::to_string(kMaxVocabularyTokens) + " tokens (the limit)");
      const size_t bad = invalid_utf8_at(line);
      if (bad != std::string_view::npos)
        throw std::runtime_error(where + "token " + quote(line) + " is not valid UTF-8 (byte " +
                                 std::to_string(bad) + ")");
      const bool special = line.size() > 2 && line.front() == '<' && line.back() == '>';
      if (line.empty() || (!special && utf8_length(line) != 1))
        throw std::runtime_error(where + "token " + quote(line) +
                                 " is neither one character nor <special>");
      const auto [it, added] = v.ids_.emplace(line, id);
      if (!added)
        throw std::runtime_error(where + "token " + quote(line) + " appears twice (first at line " +
                                 std::to_string(it->second + 1) + ")");
      v.tokens_.push_back(line);
      v.special_.push_back(special);
    }
    if (std::ferror(in))
      throw std::runtime_error("cannot read vocabulary '" + path + "': " + errno_text());
    if (v.tokens_.empty()) throw std::runtime_error("vocabulary '" + path + "' is empty");
    v.path_ = path;
    return v;
  }

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  /* The id of a token (e.g. "<pad>"), or -1. */
  int64_t id(const std::string& token) const {
    auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }
  /* The token of an id (a space is "▁"); an id outside the vocabulary throws. */
  const std::string& token(int64_t id) const {
    if (id < 0 || id >= size())
      throw std::runtime_error("id " + std::to_string(id) + " is outside the vocabulary of " +
                               std::to_string(size()));
    return tokens_[static_cast<size_t>(id)];
  }

  /* Checks this vocabulary against the model it is used with, given the model's ids (from
   * its config, kiln_model_config; -1 where the model has none, which is not checked):
   * `size` is the model's src_vocab (role "source") or tgt_vocab ("target"), and <pad>,
   * <s> and </s> sit at pad_id, bos_id and eos_id. A source vocabulary must hold <pad> (it
   * pads sentences), a target vocabulary <s> and </s>; any of the three a vocabulary holds
   * is at the model's id for it. Throws std::runtime_error naming the sizes, or which token
   * sits where. */
  void check_model(const std::string& role, int64_t size, int64_t pad_id, int64_t bos_id,
                   int64_t eos_id) const {
    const std::string key = role == "source" ? "src_vocab" : "tgt_vocab";
    const std::string name = role + " vocabulary '" + path_ + "'";
    if (size >= 0 && size != this->size())
      throw std::runtime_error(name + " has " + std::to_string(this->size()) +
                               " tokens, the model's " + key + " is " + std::to_string(size));
    struct Special {
      const char* token;
      const char* key;
      int64_t id;
      bool required;
    };
    const bool source = role == "source";
    for (const Special& s :
         {Special{"<pad>", "pad_id", pad_id, source}, Special{"<s>", "bos_id", bos_id, !source},
          Special{"</s>", "eos_id", eos_id, !source}}) {
      if (s.id < 0) continue;
      const int64_t at = id(s.token);
      if (at == s.id) continue;
      if (at < 0 && !s.required) continue;
      const std::string there =
          s.id < this->size() ? "line " + std::to_string(s.id + 1) + " holds " +
                                    quote(tokens_[static_cast<size_t>(s.id)])
                              : "the vocabulary has " + std::to_string(this->size()) + " tokens";
      if (at < 0)
        throw std::runtime_error(name + " has no " + s.token + " token; the model's " + s.key +
                                 " is " + std::to_string(s.id) + " (" + there + ")");
      throw std::runtime_error(name + " has " + s.token + " at id " + std::to_string(at) +
                               " (line " + std::to_string(at + 1) + "), the model's " + s.key +
                               " is " + std::to_string(s.id) + " (" + there + ")");
    }
  }
  /* The same with the ids of `model`'s config (kiln_model_config). */
  void check_model(const std::string& role, const kiln_model* model) const {
    auto config = [&](const char* key) -> int64_t {
      const char* v = kiln_model_config(model, key);
      return v ? std::stoll(v) : -1;
    };
    check_model(role, config(role == "source" ? "src_vocab" : "tgt_vocab"), config("pad_id"),
                config("bos_id"), config("eos_id"));
  }

  /* The ids of `text`, one per character (a space is "▁"); text that is not valid UTF-8
   * throws naming the byte, a character outside the vocabulary naming it and its column. */
  std::vector<int64_t> encode(const std::string& text) const {
    const size_t bad = invalid_utf8_at(text);
    if (bad != std::string_view::npos)
      throw std::runtime_error(quote(text) + " is not valid UTF-8 (byte " + std::to_string(bad) +
                               ")");
    std::vector<int64_t> out;
    int64_t column = 1;
    for (size_t i = 0; i < text.size(); ++column) {
      size_t n = char_bytes(static_cast<unsigned char>(text[i]));
      std::string c = text.substr(i, n);
      i += n;
      auto it = ids_.find(c == " " ? kSpace : c);
      if (it == ids_.end() || special_[it->second])
        throw std::runtime_error("character " + quote(c) + " at column " + std::to_string(column) +
                                 " of " + quote(text) + " is not in the vocabulary");
      out.push_back(it->second);
    }
    return out;
  }

  /* The text of `ids` (special tokens left out); an id outside the vocabulary throws. */
  std::string decode(const std::vector<int64_t>& ids) const {
    std::string out;
    for (int64_t id : ids) {
      if (id < 0 || id >= size())
        throw std::runtime_error("id " + std::to_string(id) + " is outside the vocabulary of " +
                                 std::to_string(size()));
      if (special_[id]) continue;
      out += tokens_[id] == kSpace ? std::string(" ") : tokens_[id];
    }
    return out;
  }

 private:
  static constexpr const char* kSpace = "\xE2\x96\x81";  // U+2581
  static std::string errno_text() { return std::strerror(errno); }
  static size_t char_bytes(unsigned char lead) {
    return lead < 0x80 ? 1 : lead >> 5 == 6 ? 2 : lead >> 4 == 14 ? 3 : lead >> 3 == 30 ? 4 : 1;
  }
  static size_t utf8_length(const std::string& s) {
    size_t n = 0;
    for (size_t i = 0; i < s.size(); ++n) i += char_bytes(static_cast<unsigned char>(s[i]));
    return n;
  }
  std::unordered_map<std::string, int64_t> ids_;  // lookups only: no order
  std::vector<std::string> tokens_;
  std::vector<bool> special_;
  std::string path_;
};

}  // namespace kiln

#endif  // KILN_VOCAB_H_
