// Vocabulary maps (vocab_map.h): parsing CTranslate2's vmap format, and the candidate target
// ids of a batch of sources.
#include "runtime/vocab_map.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>

#include "support/error.h"

namespace kiln::rt {
namespace {

// The tokens of `text` separated by runs of spaces (and tabs, in TARGETS).
std::vector<std::string> split_tokens(std::string_view text) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
    size_t end = i;
    while (end < text.size() && text[end] != ' ' && text[end] != '\t') ++end;
    if (end > i) out.emplace_back(text.substr(i, end - i));
    i = end;
  }
  return out;
}

// A token's text for a message: quoted, its start only when long.
std::string quoted(const std::string& token) {
  return token.size() <= 40 ? "'" + token + "'" : "'" + token.substr(0, 40) + "...'";
}

void sort_unique(std::vector<int64_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

VocabMap VocabMap::load(const std::string& path, const Tokens& tokens) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("vocabulary map '{}': cannot open it", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("vocabulary map '{}': cannot read it", path);
  return parse(text.str(), path, tokens);
}

VocabMap VocabMap::parse(std::string_view text, const std::string& label, const Tokens& tokens) {
  const bool strings = tokens.source_id || tokens.target_id;
  if (strings && !(tokens.source_id && tokens.target_id))
    fail("vocabulary map '{}': string tokens need both a source and a target vocabulary", label);
  VocabMap map;
  int64_t line_no = 0;
  // The id of `token` on the source or target side of line line_no.
  auto id_of = [&](const std::string& token, bool source) -> int64_t {
    const char* side = source ? "source" : "target";
    const int64_t size = source ? tokens.source_size : tokens.target_size;
    int64_t id = -1;
    if (strings) {
      id = (source ? tokens.source_id : tokens.target_id)(token);
      if (id < 0)
        fail("{}:{}: {} token {} is not in the {} vocabulary", label, line_no, side, quoted(token),
             side);
    } else {
      auto [end, ec] = std::from_chars(token.data(), token.data() + token.size(), id);
      if (ec != std::errc() || end != token.data() + token.size())
        fail("{}:{}: {} token {} is not an integer id (the map holds ids: the input is ids)", label,
             line_no, side, quoted(token));
    }
    if (id < 0 || (size > 0 && id >= size))
      fail("{}:{}: {} id {} is out of range [0, {})", label, line_no, side, id, size);
    return id;
  };
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    const size_t tab = line.find('\t');
    if (tab == std::string_view::npos)
      fail("{}:{}: no tab: a line is SOURCE<TAB>TARGETS (an empty SOURCE: always allowed)", label,
           line_no);
    std::vector<int64_t> source, targets;
    for (const std::string& t : split_tokens(line.substr(0, tab))) source.push_back(id_of(t, true));
    for (const std::string& t : split_tokens(line.substr(tab + 1)))
      targets.push_back(id_of(t, false));
    std::vector<int64_t>& into = source.empty() ? map.always_ : map.targets_[source];
    into.insert(into.end(), targets.begin(), targets.end());
    sort_unique(into);
    map.max_ngram_ = std::max(map.max_ngram_, static_cast<int64_t>(source.size()));
  }
  if (map.targets_.empty() && map.always_.empty())
    fail("vocabulary map '{}' has no entries (lines SOURCE<TAB>TARGETS)", label);
  return map;
}

std::vector<int64_t> VocabMap::candidates(const int64_t* src, int64_t rows, int64_t length,
                                          int64_t pad_id) const {
  std::vector<int64_t> out = always_;
  std::vector<int64_t> ngram;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t* row = src + r * length;
    for (int64_t i = 0; i < length; ++i) {
      ngram.clear();
      for (int64_t n = 1; n <= max_ngram_ && i + n <= length; ++n) {
        const int64_t token = row[i + n - 1];
        if (token == pad_id) break;  // n-grams never span padding
        ngram.push_back(token);
        if (auto it = targets_.find(ngram); it != targets_.end())
          out.insert(out.end(), it->second.begin(), it->second.end());
      }
    }
  }
  sort_unique(out);
  return out;
}

}  // namespace kiln::rt
