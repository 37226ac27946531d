/* A character-level vocabulary for text in and out of a compiled model (header-only C++).
 *
 * File format: one token per line, UTF-8; the line number (from 0) is the token's id. A
 * token is one character, or "▁" (U+2581) for the space character, or a special token in
 * angle brackets such as <pad>, <s>, </s> (never produced from text; left out of decoded
 * text). Example: examples/numbers/vocab.src.txt.
 */
#ifndef KILN_VOCAB_H_
#define KILN_VOCAB_H_

#include <cstdint>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln {

class Vocabulary {
 public:
  /* Reads a vocabulary file; throws std::runtime_error naming the file and line. */
  static Vocabulary load(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read vocabulary '" + path + "'");
    Vocabulary v;
    std::string line;
    for (int64_t id = 0; std::getline(in, line); ++id) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      const bool special = line.size() > 2 && line.front() == '<' && line.back() == '>';
      if (line.empty() || (!special && utf8_length(line) != 1))
        throw std::runtime_error(path + ":" + std::to_string(id + 1) + ": token '" + line +
                                 "' is neither one character nor <special>");
      if (v.ids_.count(line))
        throw std::runtime_error(path + ":" + std::to_string(id + 1) + ": token '" + line +
                                 "' appears twice");
      v.ids_[line] = id;
      v.tokens_.push_back(line);
      v.special_.push_back(special);
    }
    if (v.tokens_.empty()) throw std::runtime_error("vocabulary '" + path + "' is empty");
    return v;
  }

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  /* The id of a token (e.g. "<pad>"), or -1. */
  int64_t id(const std::string& token) const {
    auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }

  /* The ids of `text`, one per character (a space is "▁"); a character outside the
   * vocabulary throws, naming it and its column. */
  std::vector<int64_t> encode(const std::string& text) const {
    std::vector<int64_t> out;
    int64_t column = 1;
    for (size_t i = 0; i < text.size(); ++column) {
      size_t n = char_bytes(static_cast<unsigned char>(text[i]));
      std::string c = text.substr(i, n);
      i += n;
      auto it = ids_.find(c == " " ? kSpace : c);
      if (it == ids_.end() || special_[it->second])
        throw std::runtime_error("character '" + c + "' at column " + std::to_string(column) +
                                 " of '" + text + "' is not in the vocabulary");
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
  static size_t char_bytes(unsigned char lead) {
    return lead < 0x80 ? 1 : lead >> 5 == 6 ? 2 : lead >> 4 == 14 ? 3 : lead >> 3 == 30 ? 4 : 1;
  }
  static size_t utf8_length(const std::string& s) {
    size_t n = 0;
    for (size_t i = 0; i < s.size(); ++n) i += char_bytes(static_cast<unsigned char>(s[i]));
    return n;
  }
  std::map<std::string, int64_t> ids_;
  std::vector<std::string> tokens_;
  std::vector<bool> special_;
};

}  // namespace kiln

#endif  // KILN_VOCAB_H_
