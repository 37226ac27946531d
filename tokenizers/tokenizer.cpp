// Tokenizers (see tokenizer.h): the character vocabulary, SentencePiece, byte-level BPE, and the
// streaming detokenizer.
#include "tokenizers/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
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

// Byte-level BPE as GPT-2 ships it, vocab.json ({token: id}, tokens spelled in GPT-2's
// byte-to-character map) and merges.txt (one "a b" merge per line, by rank; a first line
// "#version..." is skipped), or as a Hugging Face tokenizer.json holds it (LLaMA 3's: model
// {type BPE, vocab, merges, ignore_merges}, added_tokens, and the pre_tokenizer's pattern).
// Text is split into words by the pre-tokenizer's pattern (WordSplitter: GPT-2's for
// vocab.json); each word's bytes are merged by rank (with ignore_merges, a word that is a
// token is that token). Tokens in <|...|> are special (left out of decoded text).
class Bpe : public Tokenizer {
 public:
  // A byte-level BPE however its files spell it.
  struct Parts {
    std::string vocab_label;                                  // names the vocabulary in errors
    std::vector<std::pair<std::string, int64_t>> vocab;       // token, id
    std::vector<std::pair<std::string, std::string>> merges;  // by rank
    std::string pattern = kGpt2Pattern;                       // the pre-tokenizer's
    bool ignore_merges = false;
  };
  Bpe(const std::string& path, Parts parts)
      : path_(path),
        splitter_(parts.pattern, fmt::format("BPE tokenizer '{}'", path)),
        ignore_merges_(parts.ignore_merges) {
    for (int b = 0, extra = 0; b < 256; ++b) {
      const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const int cp = kept ? b : 256 + extra++;
      byte_char_[b] = code_point_utf8(cp);
      char_byte_[byte_char_[b]] = static_cast<unsigned char>(b);
    }
    const std::string& label = parts.vocab_label;
    for (const auto& [token, i] : parts.vocab) {
      if (i < 0 || i > INT32_MAX) fail("{}: the id of token {} is not an id", label, quote(token));
      if (static_cast<int64_t>(tokens_.size()) <= i) tokens_.resize(static_cast<size_t>(i) + 1);
      if (!tokens_[static_cast<size_t>(i)].empty() && tokens_[static_cast<size_t>(i)] != token)
        fail("{}: id {} is given to {} and {}", label, i, quote(tokens_[static_cast<size_t>(i)]),
             quote(token));
      tokens_[static_cast<size_t>(i)] = token;
      ids_[token] = i;
    }
    for (size_t i = 0; i < tokens_.size(); ++i)
      if (tokens_[i].empty()) fail("{} has no token with id {}", label, i);
    int64_t rank = 0;
    for (const auto& m : parts.merges) ranks_.emplace(m, rank++);
  }

  // vocab.json and merges.txt (GPT-2's pre-tokenizer).
  static Parts read_gpt2(const std::string& vocab_path, const std::string& merges_path) {
    Parts parts;
    parts.vocab_label = fmt::format("BPE vocabulary '{}'", vocab_path);
    json::Value vocab;
    try {
      vocab = json::parse(read(vocab_path, "BPE vocabulary"));
    } catch (const Error& e) {
      fail("BPE vocabulary '{}' is not valid JSON: {}", vocab_path, e.what());
    }
    if (!vocab.is_object())
      fail("BPE vocabulary '{}' is not a JSON object of token: id", vocab_path);
    read_vocab(vocab, parts);
    std::istringstream merges(read(merges_path, "BPE merges"));
    std::string line;
    int64_t number = 0;
    while (std::getline(merges, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() ||
          line.find(' ', sp + 1) != std::string::npos)
        fail("BPE merges '{}' line {}: expected two tokens separated by one space, got {}",
             merges_path, number, quote(line));
      parts.merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
    }
    return parts;
  }

  // A Hugging Face tokenizer.json (already parsed: `file`) of a byte-level BPE: its model's
  // vocab and merges ("a b" strings or [a, b] pairs), ignore_merges, its added tokens, and its
  // pre-tokenizer: ByteLevel with use_regex (GPT-2's pattern), or a Sequence of a Split by a
  // Regex (behavior Isolated, not inverted) and a ByteLevel without use_regex (LLaMA 3's).
  static Parts read_tokenizer_json(const std::string& path, const json::Value& file) {
    Parts parts;
    parts.vocab_label = fmt::format("tokenizer.json '{}'", path);
    auto bad = [&](const std::string& why) { fail("tokenizer.json '{}': {}", path, why); };
    const json::Value& model = *file.find("model");
    const json::Value* type = model.find("type");
    if (!type || !type->is_string() || type->as_string() != "BPE")
      bad(fmt::format("its model is of type {}, and kiln reads byte-level BPE (\"BPE\")",
                      type && type->is_string() ? quote(type->as_string()) : "(none)"));
    const json::Value* vocab = model.find("vocab");
    if (!vocab || !vocab->is_object()) bad("its model has no \"vocab\" object of token: id");
    read_vocab(*vocab, parts);
    const json::Value* merges = model.find("merges");
    if (!merges || !merges->is_array()) bad("its model has no \"merges\" array");
    for (const json::Value& m : merges->as_array()) {
      if (m.is_string()) {
        const std::string& text = m.as_string();
        const size_t sp = text.find(' ');
        if (sp != std::string::npos && sp > 0 && sp + 1 < text.size() &&
            text.find(' ', sp + 1) == std::string::npos) {
          parts.merges.emplace_back(text.substr(0, sp), text.substr(sp + 1));
          continue;
        }
      } else if (m.is_array() && m.as_array().size() == 2 && m.as_array()[0].is_string() &&
                 m.as_array()[1].is_string()) {
        parts.merges.emplace_back(m.as_array()[0].as_string(), m.as_array()[1].as_string());
        continue;
      }
      bad(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", parts.merges.size() + 1));
    }
    if (const json::Value* ignore = model.find("ignore_merges"); ignore && ignore->is_bool())
      parts.ignore_merges = ignore->as_bool();
    if (const json::Value* added = file.find("added_tokens"); added && added->is_array())
      for (const json::Value& t : added->as_array()) {
        const json::Value* id = t.is_object() ? t.find("id") : nullptr;
        const json::Value* content = t.is_object() ? t.find("content") : nullptr;
        if (!id || !id->is_int() || !content || !content->is_string())
          bad("an added token is not {\"id\": N, \"content\": \"...\"}");
        parts.vocab.emplace_back(content->as_string(), id->as_int());
      }
    if (const json::Value* n = file.find("normalizer"); n && !n->is_null())
      bad("it has a normalizer, and kiln's byte-level BPE reads text as it is (none)");
    const json::Value* pre = file.find("pre_tokenizer");
    auto is = [](const json::Value& v, const char* t) {
      const json::Value* type = v.is_object() ? v.find("type") : nullptr;
      return type && type->is_string() && type->as_string() == t;
    };
    auto flag = [](const json::Value& v, const char* key, bool fallback) {
      const json::Value* f = v.find(key);
      return f && f->is_bool() ? f->as_bool() : fallback;
    };
    auto byte_level = [&](const json::Value& v, bool use_regex) {
      if (!is(v, "ByteLevel")) return false;
      if (flag(v, "add_prefix_space", false))
        bad("its ByteLevel pre-tokenizer adds a prefix space, which kiln does not");
      return flag(v, "use_regex", true) == use_regex;
    };
    const json::Value* steps = pre && is(*pre, "Sequence") ? pre->find("pretokenizers") : nullptr;
    if (pre && byte_level(*pre, true)) {
      parts.pattern = kGpt2Pattern;
    } else if (steps && steps->is_array() && steps->as_array().size() == 1 &&
               byte_level(steps->as_array()[0], true)) {
      parts.pattern = kGpt2Pattern;
    } else if (steps && steps->is_array() && steps->as_array().size() == 2 &&
               is(steps->as_array()[0], "Split") && byte_level(steps->as_array()[1], false)) {
      const json::Value& split = steps->as_array()[0];
      const json::Value* pattern = split.find("pattern");
      const json::Value* regex = pattern && pattern->is_object() ? pattern->find("Regex") : nullptr;
      const json::Value* behavior = split.find("behavior");
      if (!regex || !regex->is_string())
        bad("its Split pre-tokenizer has no {\"Regex\": \"...\"} pattern");
      if (!behavior || !behavior->is_string() || behavior->as_string() != "Isolated" ||
          flag(split, "invert", false))
        bad("its Split pre-tokenizer is not of behavior \"Isolated\" without invert");
      parts.pattern = regex->as_string();
    } else {
      bad("its pre_tokenizer is neither ByteLevel (GPT-2's) nor a Split by a regex followed by "
          "ByteLevel (LLaMA 3's)");
    }
    return parts;
  }

  const char* kind() const override { return "bpe"; }
  const std::string& path() const override { return path_; }
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }

  std::vector<int64_t> encode(const std::string& text) const override {
    if (const size_t bad = invalid_utf8_at(text); bad != std::string_view::npos)
      fail("{} is not valid UTF-8 (byte {})", quote(text), bad);
    std::vector<int64_t> out;
    for (const std::string& word : splitter_.split(text)) {
      std::vector<std::string> parts;
      for (unsigned char b : word) parts.push_back(byte_char_[b]);
      if (ignore_merges_) {
        std::string whole;
        for (const std::string& p : parts) whole += p;
        if (ids_.count(whole)) parts = {whole};
      }
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
  // The tokens of a vocabulary object {token: id} (vocab.json, a tokenizer.json's model).
  static void read_vocab(const json::Value& vocab, Parts& parts) {
    for (const auto& [token, id] : vocab.as_object()) {
      if (!id.is_int())
        fail("{}: the id of token {} is not an id", parts.vocab_label, quote(token));
      parts.vocab.emplace_back(token, id.as_int());
    }
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
  WordSplitter splitter_;
  bool ignore_merges_ = false;
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

namespace {
// A Hugging Face tokenizer.json at `path`: its byte-level BPE.
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open tokenizer.json '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  json::Value file;
  try {
    file = json::parse(text.str());
  } catch (const Error& e) {
    fail("tokenizer.json '{}' is not valid JSON: {}", path, e.what());
  }
  const json::Value* model = file.is_object() ? file.find("model") : nullptr;
  if (!model || !model->is_object())
    fail("tokenizer.json '{}' has no \"model\" object (a Hugging Face tokenizer.json)", path);
  return std::make_unique<Bpe>(path, Bpe::read_tokenizer_json(path, file));
}

bool holds_model_object(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  try {
    const json::Value v = json::parse(text.str());
    return v.is_object() && v.find("model") && v.find("model")->is_object();
  } catch (const Error&) {
    return false;
  }
}
}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::error_code ec;
  fs::path p = path;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "vocab.json", ec) && fs::exists(p / "merges.txt", ec))
      return std::make_unique<Bpe>(
          (p / "vocab.json").string(),
          Bpe::read_gpt2((p / "vocab.json").string(), (p / "merges.txt").string()));
    if (fs::exists(p / "tokenizer.json", ec))
      return load_tokenizer_json((p / "tokenizer.json").string());
    fail(
        "tokenizer folder '{}' has neither vocab.json and merges.txt nor tokenizer.json (a "
        "byte-level BPE)",
        path);
  }
  if (!fs::exists(p, ec)) fail("tokenizer '{}' does not exist", path);
  if (p.extension() == ".model") return std::make_unique<SentencePiece>(path);
  if (p.extension() == ".json") {
    if (p.filename() == "tokenizer.json") return load_tokenizer_json(path);
    const fs::path merges = p.parent_path() / "merges.txt";
    if (fs::exists(merges, ec))
      return std::make_unique<Bpe>(path, Bpe::read_gpt2(path, merges.string()));
    if (holds_model_object(path)) return load_tokenizer_json(path);
    fail("BPE vocabulary '{}' has no merges.txt beside it ('{}')", path, merges.string());
  }
  return std::make_unique<Chars>(path);
}

WordSplitter::WordSplitter(const std::string& pattern, const std::string& where)
    : pattern_(pattern) {
  int error = 0;
  PCRE2_SIZE at = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &at, nullptr);
  if (!code) {
    PCRE2_UCHAR why[256];
    pcre2_get_error_message(error, why, sizeof why);
    fail("{}: pre-tokenizer pattern {} does not compile: {} at character {}", where, quote(pattern),
         reinterpret_cast<const char*>(why), at);
  }
  code_ =
      std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
}

std::vector<std::string> WordSplitter::split(const std::string& text) const {
  pcre2_code* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> match(
      pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
  if (!match) fail("out of memory splitting text into words");
  std::vector<std::string> words;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t at = 0, from = 0;  // the end of the last word, where the next search starts
  while (from < text.size()) {
    const int rc =
        pcre2_match(code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR why[256];
      pcre2_get_error_message(rc, why, sizeof why);
      fail("pre-tokenizer pattern {} failed on {}: {}", quote(pattern_), quote_start(text),
           reinterpret_cast<const char*>(why));
    }
    const PCRE2_SIZE* span = pcre2_get_ovector_pointer(match.get());
    if (span[1] == span[0]) {  // an empty match is no word: its character joins the text between
      from = span[0] + utf8_length(static_cast<unsigned char>(text[span[0]]));
      continue;
    }
    if (span[0] > at) words.push_back(text.substr(at, span[0] - at));  // between matches
    words.push_back(text.substr(span[0], span[1] - span[0]));
    at = from = span[1];
  }
  if (at < text.size()) words.push_back(text.substr(at));
  return words;
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
