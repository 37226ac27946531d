// Tokenizers (tokenizers/tokenizer.h, issue 28) on the demo tokenizers of examples/tokenizers
// (a SentencePiece model and a GPT-2-format byte-level BPE, trained on the number translator's
// English side) and the number translator's character vocabulary: round trips of the held-out
// sentences and of UTF-8 text outside their training data, GPT-2's and LLaMA 3's
// pre-tokenization (their patterns on text outside ASCII, and a tokenizer.json selecting its
// own), the streaming detokenizer (never a partial UTF-8 character, the same text as a whole
// decode), fitting a model, and every bad file refused naming the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/error.h"
#include "tokenizers/tokenizer.h"

namespace kiln::tok {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string examples(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/../examples/" + f;
}

std::vector<std::string> heldout() {
  std::ifstream in(examples("numbers/heldout.tsv"));
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line.substr(0, line.find('\t')));
  return out;
}

const std::vector<std::string> kUtf8 = {"héllo wörld", "数字 ✓ 🙂",
                                        "  two  spaces\tand\ttabs \n", "don't we'll they're",
                                        "a1b22c333!!?"};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Every held-out sentence decodes back to itself; returns the tokens per character.
double round_trip_heldout(const Tokenizer& t) {
  size_t tokens = 0, chars = 0;
  for (const std::string& s : heldout()) {
    const std::vector<int64_t> ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s) << t.path();
    tokens += ids.size();
    chars += s.size();
  }
  return static_cast<double>(tokens) / static_cast<double>(chars);
}

TEST(Tokenizers, SentencePieceRoundTripsAnyText) {
  auto t = load_tokenizer(examples("tokenizers/numbers.spm.model"));
  EXPECT_STREQ(t->kind(), "sentencepiece");
  EXPECT_EQ(t->size(), 320);
  const double per_char = round_trip_heldout(*t);
  // Learned on these sentences: far fewer tokens than characters.
  EXPECT_LT(per_char, 1.0 / 3);
  for (const std::string& s : kUtf8)
    if (s.find_first_of(" \t\n") != 0)  // SentencePiece drops leading whitespace
      EXPECT_EQ(t->decode(t->encode(s)), s) << s;
  EXPECT_EQ(t->id("<pad>"), 0);
  EXPECT_EQ(t->id("</s>"), 2);
  EXPECT_EQ(t->id("no such piece"), -1);
  // Special tokens are left out of text.
  std::vector<int64_t> ids = t->encode("forty-two");
  ids.insert(ids.begin(), 1);
  ids.push_back(2);
  EXPECT_EQ(t->decode(ids), "forty-two");
  EXPECT_THAT(error_of([&] { t->decode({320}); }), HasSubstr("id 320 is not in SentencePiece"));
}

TEST(Tokenizers, ByteLevelBpeRoundTripsAnyText) {
  auto t = load_tokenizer(examples("tokenizers/bpe/vocab.json"));
  EXPECT_STREQ(t->kind(), "bpe");
  EXPECT_EQ(t->size(), 321);
  const double per_char = round_trip_heldout(*t);
  EXPECT_LT(per_char, 1.0 / 2);  // the merges do work
  for (const std::string& s : kUtf8) EXPECT_EQ(t->decode(t->encode(s)), s) << s;
  // The folder is the same tokenizer.
  auto same = load_tokenizer(examples("tokenizers/bpe"));
  EXPECT_EQ(same->encode("one hundred and twelve"), t->encode("one hundred and twelve"));
  // GPT-2's words: a space goes with the word after it, contractions apart, so " hundred"
  // is one token where the merges made it one, and "don't" splits before "'t".
  const std::vector<int64_t> h = t->encode(" hundred");
  EXPECT_EQ(t->decode(h), " hundred");
  EXPECT_EQ(t->encode("one hundred"), [&] {
    std::vector<int64_t> v = t->encode("one");
    v.insert(v.end(), h.begin(), h.end());
    return v;
  }());
  // <|endoftext|> is special: left out of text.
  EXPECT_EQ(t->decode({t->id("<|endoftext|>")}), "");
}

// The pre-tokenizers' splits on text outside ASCII, each expected split worked out by hand from
// the pattern's definition (tokenizer.h: kGpt2Pattern, kLlama3Pattern), alternative by
// alternative, leftmost first.
using Words = std::vector<std::string>;

TEST(Tokenizers, Gpt2PatternSplitsUnicodeLettersNumbersAndSymbols) {
  const WordSplitter gpt2(kGpt2Pattern, "test");
  // "¿" (Po) and "?" are symbols, "é" a letter; " 你好" a space and CJK letters (Lo); the
  // fullwidth comma "，" (Po) a symbol; "٣٤" Arabic-Indic digits (Nd) after a space.
  EXPECT_EQ(gpt2.split("¿Qué tal? 你好，世界 ٣٤ ok"),
            (Words{"¿", "Qué", " tal", "?", " 你好", "，", "世界", " ٣٤", " ok"}));
  // Numbers of any length are one word; accents stay in their word.
  EXPECT_EQ(gpt2.split("Héllo wörld, it's 2024!"),
            (Words{"Héllo", " wörld", ",", " it", "'s", " 2024", "!"}));
  // A combining accent (U+0301, Mn) is no letter: a decomposed "é" ends the word before it.
  EXPECT_EQ(gpt2.split("cafe\u0301 ok"), (Words{"cafe", "\u0301", " ok"}));
  // Contractions are lower case only: "'M" is a symbol and a letter.
  EXPECT_EQ(gpt2.split("I'M don't"), (Words{"I", "'", "M", " don", "'t"}));
  // \s+(?!\S): a run of whitespace leaves its last space to the word after it; "\n\n" before
  // a letter is "\n" (the run but its last) and "\n" (\s+).
  EXPECT_EQ(gpt2.split("a  b\n"), (Words{"a", " ", " b", "\n"}));
  EXPECT_EQ(gpt2.split("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(gpt2.split("12345"), (Words{"12345"}));
}

TEST(Tokenizers, Llama3PatternSplitsDigitsInThreesAndContractionsInAnyCase) {
  const WordSplitter llama3(kLlama3Pattern, "test");
  // A letter run takes one leading non-letter ("¿Qué", "，世界"); " " before digits stands
  // alone (\s+ at the end), digits go in groups of up to 3 from the left; "'M" is a
  // contraction in any case.
  EXPECT_EQ(llama3.split("¿Qué tal? 你好，世界 1234567 I'M"),
            (Words{"¿Qué", " tal", "?", " 你好", "，世界", " ", "123", "456", "7", " I", "'M"}));
  EXPECT_EQ(llama3.split("Héllo wörld, it's 2024!"),
            (Words{"Héllo", " wörld", ",", " it", "'s", " ", "202", "4", "!"}));
  EXPECT_EQ(llama3.split("٣٤٥٦"), (Words{"٣٤٥", "٦"}));  // Arabic-Indic digits are \p{N}
  EXPECT_EQ(llama3.split("cafe\u0301 ok"), (Words{"cafe", "\u0301", " ok"}));  // U+0301: Mn
  // \s*[\r\n]+: the newlines of a run go together, with the spaces before them.
  EXPECT_EQ(llama3.split("a\n\nb"), (Words{"a", "\n\n", "b"}));
  EXPECT_EQ(llama3.split("x  \n y"), (Words{"x", "  \n", " y"}));
  // Symbols take the newlines after them.
  EXPECT_EQ(llama3.split("ok!!\n\nz"), (Words{"ok", "!!\n\n", "z"}));
}

// A byte-level BPE in a Hugging Face tokenizer.json: GPT-2's byte alphabet and the merges
// "3 4" (rank 0) and "1 2" (rank 1), with `pre_tokenizer`.
std::string write_tokenizer_json(const fs::path& path, const std::string& pre_tokenizer) {
  std::string vocab;
  for (int b = 0, extra = 0; b < 256; ++b) {
    const bool kept = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = kept ? b : 256 + extra++;
    std::string c;
    if (cp == '"' || cp == '\\')
      c = std::string("\\") + static_cast<char>(cp);
    else if (cp < 0x80)
      c = std::string(1, static_cast<char>(cp));
    else
      c = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    vocab += "\"" + c + "\": " + std::to_string(b) + ", ";
  }
  vocab += "\"34\": 256, \"12\": 257";
  std::ofstream(path) << "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 258, \"content\": "
                         "\"<|end_of_text|>\", \"special\": true}], \"normalizer\": null, "
                         "\"pre_tokenizer\": "
                      << pre_tokenizer
                      << ", \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {"
                      << vocab << "}, \"merges\": [\"3 4\", [\"1\", \"2\"]]}}";
  return path.string();
}

TEST(Tokenizers, TokenizerJsonSelectsItsPreTokenizer) {
  const fs::path dir = fs::path(::testing::TempDir()) / "tokenizers_json";
  fs::remove_all(dir);
  fs::create_directories(dir / "llama3");
  fs::create_directories(dir / "gpt2");
  // LLaMA 3's pre_tokenizer as its tokenizer.json spells it (the pattern JSON-escaped).
  std::string pattern;
  for (const char* c = kLlama3Pattern; *c; ++c) pattern += *c == '\\' ? "\\\\" : std::string(1, *c);
  const std::string llama3_json = write_tokenizer_json(
      dir / "llama3" / "tokenizer.json",
      "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
      "{\"Regex\": \"" +
          pattern +
          "\"}, \"behavior\": \"Isolated\", \"invert\": false}, "
          "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
          "\"use_regex\": false}]}");
  const std::string gpt2_json = write_tokenizer_json(
      dir / "gpt2" / "tokenizer.json",
      "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}");
  auto llama3 = load_tokenizer(llama3_json);
  auto gpt2 = load_tokenizer((dir / "gpt2").string());  // the folder holding it
  EXPECT_STREQ(llama3->kind(), "bpe");
  EXPECT_EQ(llama3->size(), 259);
  const int64_t one = '1', three = '3', four = '4', t12 = 257, t34 = 256;
  // GPT-2: "1234" is one word, "3 4" merges first, then "1 2". LLaMA 3: "123" and "4", so
  // "3" and "4" never meet.
  EXPECT_EQ(gpt2->encode("1234"), (std::vector<int64_t>{t12, t34}));
  EXPECT_EQ(llama3->encode("1234"), (std::vector<int64_t>{t12, three, four}));
  EXPECT_EQ(llama3->encode("1"), (std::vector<int64_t>{one}));
  for (const auto* t : {&gpt2, &llama3})
    for (const std::string& s : kUtf8) EXPECT_EQ((*t)->decode((*t)->encode(s)), s) << s;
  EXPECT_EQ(llama3->decode({t34, 258}), "34");  // the added token is special
  EXPECT_EQ(llama3->id("<|end_of_text|>"), 258);

  // Refused, naming the file and the problem.
  auto write = [&](const std::string& text) {
    std::ofstream(dir / "bad.json") << text;
    return (dir / "bad.json").string();
  };
  EXPECT_THAT(error_of([&] {
                load_tokenizer(write_tokenizer_json(
                    dir / "tokenizer.json",
                    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                    "\"pattern\": {\"Regex\": \"(\\\\p{L}\"}, \"behavior\": \"Isolated\"}, "
                    "{\"type\": \"ByteLevel\", \"use_regex\": false}]}"));
              }),
              HasSubstr("pre-tokenizer pattern '(\\p{L}' does not compile: missing closing "
                        "parenthesis at character 6"));
  EXPECT_THAT(
      error_of([&] {
        load_tokenizer(write_tokenizer_json(dir / "tokenizer.json", "{\"type\": \"Whitespace\"}"));
      }),
      HasSubstr("its pre_tokenizer is neither ByteLevel (GPT-2's) nor a Split by a regex "
                "followed by ByteLevel (LLaMA 3's)"));
  EXPECT_THAT(error_of([&] { load_tokenizer(write("{\"model\": {\"type\": \"Unigram\"}}")); }),
              HasSubstr("its model is of type 'Unigram', and kiln reads byte-level BPE"));
  EXPECT_THAT(error_of([&] {
                load_tokenizer(
                    write("{\"model\": {\"type\": \"BPE\", \"vocab\": "
                          "{\"a\": 0}, \"merges\": [\"a\"]}}"));
              }),
              HasSubstr("merge 1 is neither \"a b\" nor [\"a\", \"b\"]"));
}

TEST(Tokenizers, StreamingGivesWholeCharactersAndTheSameText) {
  for (const char* file :
       {"tokenizers/bpe/vocab.json", "tokenizers/numbers.spm.model", "numbers/vocab.src.txt"}) {
    auto t = load_tokenizer(examples(file));
    std::vector<std::string> texts = {"three hundred and twelve thousand and one"};
    if (std::string(t->kind()) != "chars")
      texts.insert(texts.end(), kUtf8.begin() + 1, kUtf8.end());
    for (const std::string& s : texts) {
      if (std::string(t->kind()) == "sentencepiece" && s.find_first_of(" \t\n") == 0) continue;
      StreamDecoder d(*t);
      std::string streamed;
      for (int64_t id : t->encode(s)) {
        const std::string piece = d.push(id);
        // Each piece is whole UTF-8: its first byte is no continuation byte.
        if (!piece.empty()) EXPECT_NE(static_cast<unsigned char>(piece[0]) & 0xC0, 0x80) << s;
        EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << s;
        streamed += piece;
      }
      streamed += d.finish();
      EXPECT_EQ(streamed, s) << file;
    }
  }
  // A byte-level token cut inside a character: the bytes wait, and finish() gives U+FFFD.
  auto bpe = load_tokenizer(examples("tokenizers/bpe/vocab.json"));
  const std::vector<int64_t> ids = bpe->encode("✓");  // 3 byte tokens (no merges for it)
  ASSERT_EQ(ids.size(), 3u);
  StreamDecoder d(*bpe);
  EXPECT_EQ(d.push(ids[0]), "");
  EXPECT_EQ(d.push(ids[1]), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Tokenizers, FittingAModel) {
  auto spm = load_tokenizer(examples("tokenizers/numbers.spm.model"));
  spm->check_model("source", 320, 0, 1, 2);
  EXPECT_THAT(error_of([&] { spm->check_model("source", 32, 0, 1, 2); }),
              HasSubstr("has 320 tokens, the model's src_vocab is 32"));
  EXPECT_THAT(error_of([&] { spm->check_model("target", 320, 0, 1, 3); }),
              HasSubstr("has its eos token at id 2, the model's eos_id is 3"));
  auto chars = load_tokenizer(examples("numbers/vocab.src.txt"));
  EXPECT_THAT(error_of([&] { chars->check_model("source", 1000, 0, 1, 2); }),
              HasSubstr("the model's src_vocab is 1000"));
}

TEST(Tokenizers, BadFilesAreRefusedNamingTheProblem) {
  const fs::path dir = fs::path(::testing::TempDir()) / "tokenizers_bad";
  fs::remove_all(dir);
  fs::create_directories(dir / "bpe");
  auto write = [&](const fs::path& p, const std::string& text) { std::ofstream(p) << text; };
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "nope.model").string()); }),
              HasSubstr("does not exist"));
  write(dir / "corrupt.model", "this is not a protobuf");
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "corrupt.model").string()); }),
              HasSubstr("cannot load SentencePiece model"));
  write(dir / "bpe" / "vocab.json", "{\"a\": 0,");
  write(dir / "bpe" / "merges.txt", "#version: 0.2\n");
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "bpe" / "vocab.json").string()); }),
              HasSubstr("is not valid JSON"));
  write(dir / "bpe" / "vocab.json", "{\"a\": 0, \"b\": 0}");
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "bpe").string()); }),
              HasSubstr("id 0 is given to"));
  write(dir / "bpe" / "vocab.json", "{\"a\": 0, \"b\": 2}");
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "bpe").string()); }),
              HasSubstr("has no token with id 1"));
  write(dir / "bpe" / "vocab.json", "{\"a\": 0, \"b\": 1}");
  write(dir / "bpe" / "merges.txt", "#version: 0.2\na b c\n");
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "bpe").string()); }),
              HasSubstr("merges.txt' line 2: expected two tokens"));
  fs::remove(dir / "bpe" / "merges.txt");
  EXPECT_THAT(error_of([&] { load_tokenizer((dir / "bpe" / "vocab.json").string()); }),
              HasSubstr("has no merges.txt beside it"));
  // Text a tokenizer cannot encode.
  auto chars = load_tokenizer(examples("numbers/vocab.src.txt"));
  EXPECT_THAT(error_of([&] { chars->encode("FORTY"); }), HasSubstr("is not in the vocabulary"));
  auto bpe = load_tokenizer(examples("tokenizers/bpe/vocab.json"));
  EXPECT_THAT(error_of([&] { bpe->encode("bad \xC3("); }), HasSubstr("is not valid UTF-8"));
  EXPECT_THAT(error_of([&] { bpe->decode({-1}); }), HasSubstr("id -1 is not in BPE vocabulary"));
}

}  // namespace
}  // namespace kiln::tok
