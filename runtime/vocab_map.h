// A vocabulary map (CTranslate2's vmap, its `use_vmap`): which target tokens a source may
// translate to, for vocabulary restriction (kiln_search_options.vocabulary). kiln translate
// --vocab-map reads one and restricts each batch to the candidates of its sources.
//
// The file has one entry a line, `SOURCE<TAB>TARGETS`: SOURCE is one source token or an
// n-gram (tokens separated by spaces), TARGETS the target tokens it may give (separated by
// spaces). A line whose SOURCE is empty lists tokens always allowed. Lines that repeat a
// source add to its targets; empty lines are skipped. Tokens are strings, resolved by the
// caller's token → id functions (its tokenizers), or integer ids.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::rt {

class VocabMap {
 public:
  // A token's id, -1 when there is none.
  using TokenId = std::function<int64_t(const std::string&)>;

  // How tokens are written: strings resolved by `source_id` and `target_id` (both set), or,
  // with both empty, integer ids, checked against `source_size` and `target_size` (each
  // -1: unchecked). An id a function returns is checked the same way.
  struct Tokens {
    TokenId source_id, target_id;
    int64_t source_size = -1, target_size = -1;
  };

  // Reads the map in file `path` (see the top of this file). Throws kiln::Error naming
  // `path`:line and the problem: a line without a tab, an unknown token, an id that is not
  // an integer or is out of range, a file without entries, a file it cannot read.
  static VocabMap load(const std::string& path, const Tokens& tokens);
  // The same for the text of a file, `label` naming it in errors.
  static VocabMap parse(std::string_view text, const std::string& label, const Tokens& tokens);

  // The target ids allowed for a batch of sources `src` [rows, length] (row-major, each row
  // padded with `pad_id`; -1: no padding): the always-allowed tokens and the targets of every
  // source n-gram of the map (up to the longest, padding never inside one) found in a row;
  // sorted, unique. May be empty.
  std::vector<int64_t> candidates(const int64_t* src, int64_t rows, int64_t length,
                                  int64_t pad_id) const;
  std::vector<int64_t> candidates(const std::vector<int64_t>& src, int64_t rows, int64_t length,
                                  int64_t pad_id) const {
    return candidates(src.data(), rows, length, pad_id);
  }

  // The tokens always allowed (sorted, unique), the longest source n-gram, the entries.
  const std::vector<int64_t>& always() const { return always_; }
  int64_t max_ngram() const { return max_ngram_; }
  size_t size() const { return targets_.size(); }

 private:
  std::vector<int64_t> always_;
  std::map<std::vector<int64_t>, std::vector<int64_t>> targets_;  // n-gram -> ids (sorted)
  int64_t max_ngram_ = 0;
};

}  // namespace kiln::rt
