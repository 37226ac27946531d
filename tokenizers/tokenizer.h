// Tokenizers for text in and out of compiled models (issue 28): kiln translate's character
// vocabulary (kiln/vocab.h), SentencePiece models (Debian's libsentencepiece), and byte-level
// BPE as GPT-2 ships it (vocab.json + merges.txt); one interface, chosen by the file, and a
// UTF-8-safe incremental detokenizer for streaming. Library kiln_tokenizers, linked by kiln-run
// and the Python module (never by the runtime: applications that do not tokenize do not link
// SentencePiece).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::tok {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "chars", "sentencepiece" or "bpe".
  virtual const char* kind() const = 0;
  // The file it was loaded from.
  virtual const std::string& path() const = 0;
  virtual int64_t size() const = 0;
  // The ids of `text` (no begin or end token added). Throws kiln::Error naming what cannot
  // be encoded (a character a character vocabulary lacks, text that is not UTF-8).
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  // The text of `ids`, special tokens (<pad>, <s>, </s>, ...) left out. Throws kiln::Error
  // for an id outside the vocabulary.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // A token's id, -1 if absent (special tokens by their text: "<pad>", "</s>").
  virtual int64_t id(const std::string& token) const = 0;
  // Refuses a tokenizer that does not fit a model (kiln::Error naming sizes or the special
  // token that sits elsewhere): `size` the model's vocabulary (src_vocab or tgt_vocab; -1:
  // unknown), pad/bos/eos its ids (-1: none); `role` "source" or "target".
  virtual void check_model(const std::string& role, int64_t size, int64_t pad_id, int64_t bos_id,
                           int64_t eos_id) const;
};

// Loads the tokenizer in `path`: a SentencePiece model (*.model), a byte-level BPE (vocab.json
// with merges.txt beside it, split by GPT-2's pattern; a Hugging Face tokenizer.json, split by
// the pattern its pre_tokenizer names, e.g. LLaMA 3's; or a folder holding either), or else a
// character vocabulary (one token per line, kiln/vocab.h). Throws kiln::Error naming the file
// and what is wrong with it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// Byte-level BPE's pre-tokenizer patterns, exactly as the tokenizers define them (\p{L}
// letters and \p{N} numbers of all of Unicode, \s Unicode whitespace):
// GPT-2's (its encoder.py; tokenizer.json's ByteLevel with use_regex) ...
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// ... and LLaMA 3's (its tokenizer.json's Split; tiktoken's cl100k_base): contractions in any
// case, a letter run with one leading non-letter, numbers in groups of up to 3 digits.
inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Splits text into the words a byte-level BPE merges within: each match of a pattern
// (PCRE2, Debian's libpcre2, in UTF and Unicode-property mode), and any text between
// matches as a word of its own (Hugging Face's Split "Isolated"). Safe to use from several
// threads at once.
class WordSplitter {
 public:
  // Throws kiln::Error "<where>: pre-tokenizer pattern ... does not compile: <why> at
  // character N".
  WordSplitter(const std::string& pattern, const std::string& where);
  // `text` must be valid UTF-8 (checked by the caller).
  std::vector<std::string> split(const std::string& text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::shared_ptr<void> code_;  // pcre2_code
};

// Streaming detokenization: push() each generated id and print what it returns, the text the
// ids so far add, never a partial UTF-8 character (a byte-level token may end inside one: the
// bytes wait for the rest); finish() returns what is left (an incomplete character at the
// very end as U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : t_(tokenizer) {}
  std::string push(int64_t id);
  std::string finish();

 private:
  const Tokenizer& t_;
  std::vector<int64_t> ids_;
  size_t emitted_ = 0;  // bytes of decode(ids_) already returned
};

}  // namespace kiln::tok
