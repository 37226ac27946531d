// Tokenizers (see tokenizer.h): the character vocabulary, SentencePiece, byte-level BPE, and the
// streaming detokenizer.
#include "tokenizers/tokenizer.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "kiln/vocab.h"
#include "runtime/json.h"
#include "support/error.h"

namespace kiln::tok {
namespace {
namespace fs = std::filesystem;

// The byte length of the UTF-8 sequence `lead` starts (1 for a stray continuation byte).
size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 1;
}

// `s` with every invalid UTF-8 sequence replaced by U+FFFD.
std::string valid_utf8(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_length(static_cast<unsigned char>(s[i]));
    bool ok = i + n <= s.size() && (n > 1 || static_cast<unsigned char>(s[i]) < 0x80);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
    if (ok && invalid_utf8_at(s.substr(i, n)) == std::string_view::npos) {
      out.append(s, i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += 1;
    }
  }
  return out;
}

// The common check_model: sizes, and each special token the tokenizer has at the model's id.
void check_specials(const Tokenizer& t, const std::string& role, int64_t size, int64_t pad_id,
                    int64_t bos_id, int64_t eos_id, int64_t pad_at, int64_t bos_at,
                    int64_t eos_at) {
  const std::string name = fmt::format("{} tokenizer '{}'", role, t.path());
  if (size >= 0 && size != t.size())
    fail("{} has {} tokens, the model's {} is {}", name, t.size(),
         role == "source" ? "src_vocab" : "tgt_vocab", size);
  struct Special {
    const char* what;
    int64_t model, here;
  };
  for (const Special& s : {Special{"pad", pad_id, pad_at}, Special{"bos", bos_id, bos_at},
                           Special{"eos", eos_id, eos_at}})
    if (s.model >= 0 && s.here >= 0 && s.model != s.here)
      fail("{} has its {} token at id {}, the model's {}_id is {}", name, s.what, s.here, s.what,
           s.model);
}

// kiln translate's character vocabulary.
class Chars : public Tokenizer {
 public:
  explicit Chars(const std::string& path) : path_(path), v_(load(path)) {}
  const char* kind() const override { return "chars"; }
  const std::string& path() const override { return path_; }
  int64_t size() const override { return v_.size(); }
  std::vector<int64_t> encode(const std::string& text) const override {
    try {
      return v_.encode(text);
    } catch (const std::runtime_error& e) {
      fail("{}", e.what());
    }
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    try {
      return v_.decode(ids);
    } catch (const std::runtime_error& e) {
      fail("{}", e.what());
    }
  }
  int64_t id(const std::string& token) const override { return v_.id(token); }
  void check_model(const std::string& role, int64_t size, int64_t pad_id, int64_t bos_id,
                   int64_t eos_id) const override {
    try {
      v_.check_model(role, size, pad_id, bos_id, eos_id);
    } catch (const std::runtime_error& e) {
      fail("{}", e.what());
    }
  }

 private:
  static Vocabulary load(const std::string& path) {
    try {
      return Vocabulary::load(path);
    } catch (const std::runtime_error& e) {
      fail("{}", e.what());
    }
  }
  std::string path_;
  Vocabulary v_;
};

// A SentencePiece model (unigram or BPE, as spm_train writes it).
class SentencePiece : public Tokenizer {
 public:
  explicit SentencePiece(const std::string& path) : path_(path) {
    const auto status = sp_.Load(path);
    if (!status.ok()) fail("cannot load SentencePiece model '{}': {}", path, status.ToString());
  }
  const char* kind() const override { return "sentencepiece"; }
  const std::string& path() const override { return path_; }
  int64_t size() const override { return sp_.GetPieceSize(); }
  std::vector<int64_t> encode(const std::string& text) const override {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
      fail("{} is not valid UTF-8 (byte {})", quote(text), bad);
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) fail("SentencePiece cannot encode {}: {}", quote(text), status.ToString());
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int> in;
    for (int64_t id : ids) {
      if (id < 0 || id >= size())
        fail("id {} is not in SentencePiece model '{}' ({} pieces)", id, path_, size());
      in.push_back(static_cast<int>(id));
    }
    std::string out;
    const auto status = sp_.Decode(in, &out);
    if (!status.ok()) fail("SentencePiece cannot decode: {}", status.ToString());
    return out;
  }
  int64_t id(const std::string& token) const override {
    const int i = sp_.PieceToId(token);
    return i >= 0 && sp_.IdToPiece(i) == token ? i : -1;
  }
  void check_model(const std::string& role, int64_t size, int64_t pad_id, int64_t bos_id,
                   int64_t eos_id) const override {
    check_specials(*this, role, size, pad_id, bos_id, eos_id, sp_.pad_id(), sp_.bos_id(),
                   sp_.eos_id());
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

// Byte-level BPE as GPT-2 ships it: vocab.json ({token: id}, tokens spelled in GPT-2's
// byte-to-character map) and merges.txt (one "a b" merge per line, by rank; a first line
// "#version..." is skipped). Text is split into words by GPT-2's pattern (contractions, a
// space and letters, a space and digits, a space and other symbols, whitespace), with \p{L}
// approximated by ASCII letters and every non-ASCII character and \p{N} by ASCII digits; each
// word's bytes are merged by rank. Tokens in <|...|> are special (left out of decoded text).
class Bpe : public Tokenizer {
 public:
  Bpe(const std::string& vocab_path, const std::string& merges_path) : path_(vocab_path) {
    for (int b = 0, extra = 0; b < 256; ++b) {
      const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const int cp = kept ? b : 256 + extra++;
      byte_char_[b] = code_point_utf8(cp);
      char_byte_[byte_char_[b]] = static_cast<unsigned char>(b);
    }
    json::Value vocab;
    try {
      vocab = json::parse(read(vocab_path, "BPE vocabulary"));
    } catch (const Error& e) {
      fail("BPE vocabulary '{}' is not valid JSON: {}", vocab_path, e.what());
    }
    if (!vocab.is_object())
      fail("BPE vocabulary '{}' is not a JSON object of token: id", vocab_path);
    for (const auto& [token, id] : vocab.as_object()) {
      if (!id.is_int() || id.as_int() < 0 || id.as_int() > INT32_MAX)
        fail("BPE vocabulary '{}': the id of token {} is not an id", vocab_path, quote(token));
      const int64_t i = id.as_int();
      if (static_cast<int64_t>(tokens_.size()) <= i) tokens_.resize(static_cast<size_t>(i) + 1);
      if (!tokens_[static_cast<size_t>(i)].empty())
        fail("BPE vocabulary '{}': id {} is given to {} and {}", vocab_path, i,
             quote(tokens_[static_cast<size_t>(i)]), quote(token));
      tokens_[static_cast<size_t>(i)] = token;
      ids_[token] = i;
    }
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (tokens_[i].empty()) fail("BPE vocabulary '{}' has no token with id {}", vocab_path, i);
    std::istringstream merges(read(merges_path, "BPE merges"));
    std::string line;
    int64_t rank = 0, number = 0;
    while (std::getline(merges, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        fail("BPE merges '{}' line {}: expected two tokens separated by one space, got {}",
             merges_path, number, quote(line));
      ranks_[{line.substr(0, sp), line.substr(sp + 1)}] = rank++;
    }
  }
  const char* kind() const override { return "bpe"; }
  const std::string& path() const override { return path_; }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

  std::vector<int64_t> encode(const std::string& text) const override {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
      fail("{} is not valid UTF-8 (byte {})", quote(text), bad);
    std::vector<int64_t> out;
    for (const std::string& word : split_words(text)) {
      std::vector<std::string> parts;
      for (unsigned char b : word) parts.push_back(byte_char_[b]);
      merge(parts);
      for (const std::string& p : parts) {
        auto it = ids_.find(p);
        if (it == ids_.end())
          fail("BPE vocabulary '{}' has no token {} (from {})", path_, quote(p), quote(word));
        out.push_back(it->second);
      }
    }
    return out;
  }

  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string bytes;
    for (int64_t id : ids) {
      if (id < 0 || id >= size())
        fail("id {} is not in BPE vocabulary '{}' ({} tokens)", id, path_, size());
      const std::string& t = tokens_[static_cast<size_t>(id)];
      if (t.size() > 4 && t.rfind("<|", 0) == 0 && t.substr(t.size() - 2) == "|>") continue;
      for (size_t i = 0; i < t.size();) {
        const size_t n = utf8_length(static_cast<unsigned char>(t[i]));
        auto b = char_byte_.find(t.substr(i, n));
        if (b == char_byte_.end())
          fail("BPE vocabulary '{}': token {} (id {}) is not in GPT-2's byte alphabet", path_,
               quote(t), id);
        bytes += static_cast<char>(b->second);
        i += n;
      }
    }
    return valid_utf8(bytes);
  }

  int64_t id(const std::string& token) const override {
    auto it = ids_.find(token);
    return it == ids_.end() ? -1 : it->second;
  }
  void check_model(const std::string& role, int64_t size, int64_t pad_id, int64_t bos_id,
                   int64_t eos_id) const override {
    check_specials(*this, role, size, pad_id, bos_id, eos_id, -1, -1, id("<|endoftext|>"));
  }

 private:
  static std::string read(const std::string& path, const char* what) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail("cannot open {} '{}'", what, path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static std::string code_point_utf8(int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  }
  enum class Class { space, letter, digit, other };
  static Class class_of(const std::string& text, size_t i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v')
      return Class::space;
    if (c >= 0x80 || std::isalpha(c)) return Class::letter;
    if (std::isdigit(c)) return Class::digit;
    return Class::other;
  }
  // GPT-2's pre-tokenization (see the class comment).
  static std::vector<std::string> split_words(const std::string& text) {
    std::vector<std::string> words;
    size_t i = 0;
    auto run = [&](size_t from, Class c) {
      size_t j = from;
      while (j < text.size() && class_of(text, j) == c)
        j += utf8_length(static_cast<unsigned char>(text[j]));
      return j;
    };
    while (i < text.size()) {
      if (text[i] == '\'') {
        bool matched = false;
        for (const char* s : {"s", "t", "re", "ve", "m", "ll", "d"})
          if (text.compare(i + 1, std::strlen(s), s) == 0) {
            words.push_back(text.substr(i, 1 + std::strlen(s)));
            i += 1 + std::strlen(s);
            matched = true;
            break;
          }
        if (matched) continue;
      }
      const Class c = class_of(text, i);
      if (c == Class::space) {
        const size_t j = run(i, Class::space);
        if (j == text.size()) {  // trailing whitespace
          words.push_back(text.substr(i));
          i = j;
          continue;
        }
        // \s+(?!\S): the run but its last character, which (a space) starts the next word or
        // (other whitespace) stands alone.
        if (j - 1 > i) words.push_back(text.substr(i, j - 1 - i));
        i = j - 1;
        if (text[i] != ' ') {
          words.push_back(text.substr(i, 1));
          i = j;
          continue;
        }
        const size_t k = run(j, class_of(text, j));
        words.push_back(text.substr(i, k - i));
        i = k;
        continue;
      }
      const size_t j = run(i, c);
      words.push_back(text.substr(i, j - i));
      i = j;
    }
    return words;
  }
  void merge(std::vector<std::string>& parts) const {
    while (parts.size() > 1) {
      int64_t best = -1;
      size_t at = 0;
      for (size_t i = 0; i + 1 < parts.size(); ++i) {
        auto it = ranks_.find({parts[i], parts[i + 1]});
        if (it != ranks_.end() && (best < 0 || it->second < best)) {
          best = it->second;
          at = i;
        }
      }
      if (best < 0) return;
      const std::pair<std::string, std::string> pair{parts[at], parts[at + 1]};
      std::vector<std::string> merged;
      for (size_t i = 0; i < parts.size();) {
        if (i + 1 < parts.size() && parts[i] == pair.first && parts[i + 1] == pair.second) {
          merged.push_back(parts[i] + parts[i + 1]);
          i += 2;
        } else {
          merged.push_back(parts[i++]);
        }
      }
      parts = std::move(merged);
    }
  }

  std::string path_;
  std::string byte_char_[256];
  std::unordered_map<std::string, unsigned char> char_byte_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int64_t> ids_;
  std::map<std::pair<std::string, std::string>, int64_t> ranks_;
};

}  // namespace

void Tokenizer::check_model(const std::string& role, int64_t size, int64_t pad_id, int64_t bos_id,
                            int64_t eos_id) const {
  check_specials(*this, role, size, pad_id, bos_id, eos_id, -1, -1, -1);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  fs::path p = path;
  if (fs::is_directory(p, ec)) {
    if (!fs::exists(p / "vocab.json", ec) || !fs::exists(p / "merges.txt", ec))
      fail("tokenizer folder '{}' has no vocab.json and merges.txt (a byte-level BPE)", path);
    return std::make_unique<Bpe>((p / "vocab.json").string(), (p / "merges.txt").string());
  }
  if (!fs::exists(p, ec)) fail("tokenizer '{}' does not exist", path);
  if (p.extension() == ".model") return std::make_unique<SentencePiece>(path);
  if (p.extension() == ".json") {
    const fs::path merges = p.parent_path() / "merges.txt";
    if (!fs::exists(merges, ec))
      fail("BPE vocabulary '{}' has no merges.txt beside it ('{}')", path, merges.string());
    return std::make_unique<Bpe>(path, merges.string());
  }
  return std::make_unique<Chars>(path);
}

std::string StreamDecoder::push(int64_t id) {
  ids_.push_back(id);
  const std::string text = t_.decode(ids_);
  // Hold back a replacement character at the end (a byte token that starts a character whose
  // other bytes are still to come decodes to U+FFFD until they do).
  size_t safe = text.size();
  while (safe >= 3 && text.compare(safe - 3, 3, "\xEF\xBF\xBD") == 0) safe -= 3;
  if (safe <= emitted_) return "";
  std::string out = text.substr(emitted_, safe - emitted_);
  emitted_ = safe;
  return out;
}

std::string StreamDecoder::finish() {
  const std::string text = t_.decode(ids_);
  std::string out = text.size() > emitted_ ? text.substr(emitted_) : "";
  emitted_ = text.size();
  return out;
}

}  // namespace kiln::tok
