// Parser of the IR text form (.kir): a hand-written lexer and a recursive-descent parser
// for the grammar documented in ir/printer.h.
#include "ir/parser.h"

#include <charconv>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ir/verifier.h"
#include "support/error.h"

namespace kiln::ir {
namespace {

enum class Tok {
  kEof,
  kIdent,   // [A-Za-z_][A-Za-z0-9_.]*: keywords, op names, dtypes, symbols, keys
  kInt,     // -?[0-9]+
  kFloat,   // a number with '.', 'e' or 'E' in it, or "-inf"
  kString,  // "..." with escapes
  kGlobal,  // @NAME (weights, functions, the module)
  kValue,   // %NAME
  kPunct,   // '->' or any other single character
};

struct Token {
  Tok kind = Tok::kEof;
  std::string_view text;  // the source text of the token
  Loc loc;
  std::string str;  // kString: the decoded string; kGlobal, kValue: the name after the sigil
};

bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_alpha(c) || is_digit(c) || c == '_' || c == '.'; }
bool is_ident_start(char c) { return is_alpha(c) || c == '_'; }

int hex_value(char c) {
  if (is_digit(c)) return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Source text shown in a message: non-printable bytes escaped, long tokens shortened.
std::string display(std::string_view text) {
  constexpr size_t kMaxShown = 40;
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += static_cast<char>(c);
  }
  if (text.size() > kMaxShown) out += "...";
  return out;
}

[[noreturn]] void error_at(const std::string& file, Loc loc, const std::string& message) {
  throw Error(fmt::format("{}:{}:{}: error: {}", file, loc.line, loc.col, message));
}

class Lexer {
 public:
  Lexer(std::string_view text, const std::string& file) : text_(text), file_(file) {}

  Token next() {
    skip_space_and_comments();
    Token tok;
    tok.loc = Loc{line_, col_};
    const size_t start = pos_;
    if (pos_ >= text_.size()) {
      tok.kind = Tok::kEof;
      return tok;
    }
    const char c = text_[pos_];
    if ((c == '@' || c == '%') && is_name_char(peek(1))) {
      bump();
      while (is_name_char(peek(0))) bump();
      tok.kind = c == '@' ? Tok::kGlobal : Tok::kValue;
      tok.str = std::string(text_.substr(start + 1, pos_ - start - 1));
    } else if (c == '@' && peek(1) == '"') {
      // A quoted global name: a weight named by an importer (`@"onnx::MatMul_312"`).
      bump();
      lex_string(&tok);
      tok.kind = Tok::kGlobal;
    } else if (c == '"') {
      lex_string(&tok);
    } else if (is_digit(c) || (c == '-' && is_digit(peek(1)))) {
      lex_number(&tok);
    } else if (c == '-' && text_.substr(pos_, 4) == "-inf" && !is_name_char(peek(4))) {
      for (int i = 0; i < 4; ++i) bump();
      tok.kind = Tok::kFloat;
    } else if (c == '-' && peek(1) == '>') {
      bump();
      bump();
      tok.kind = Tok::kPunct;
    } else if (is_ident_start(c)) {
      while (is_name_char(peek(0))) bump();
      tok.kind = Tok::kIdent;
    } else {
      bump();
      tok.kind = Tok::kPunct;
    }
    tok.text = text_.substr(start, pos_ - start);
    return tok;
  }

 private:
  char peek(size_t ahead) const { return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0'; }

  void bump() {
    if (pos_ >= text_.size()) return;
    if (text_[pos_] == '\n') {
      ++line_;
      col_ = 1;
    } else {
      ++col_;
    }
    ++pos_;
  }

  void skip_space_and_comments() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        bump();
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') bump();
      } else {
        break;
      }
    }
  }

  // -?[0-9]+ ('.' [0-9]+)? ([eE] [+-]? [0-9]+)?, not followed by a name character.
  void lex_number(Token* tok) {
    const Loc loc{line_, col_};
    const size_t start = pos_;
    bool is_float = false;
    bool bad = false;
    if (peek(0) == '-') bump();
    while (is_digit(peek(0))) bump();
    if (peek(0) == '.') {
      is_float = true;
      bump();
      if (!is_digit(peek(0))) bad = true;
      while (is_digit(peek(0))) bump();
    }
    if (!bad && (peek(0) == 'e' || peek(0) == 'E')) {
      is_float = true;
      bump();
      if (peek(0) == '+' || peek(0) == '-') bump();
      if (!is_digit(peek(0))) bad = true;
      while (is_digit(peek(0))) bump();
    }
    if (bad || is_name_char(peek(0))) {
      while (is_name_char(peek(0)) || peek(0) == '+' || peek(0) == '-') bump();
      error_at(file_, loc,
               fmt::format("invalid number '{}'", display(text_.substr(start, pos_ - start))));
    }
    tok->kind = is_float ? Tok::kFloat : Tok::kInt;
  }

  void lex_string(Token* tok) {
    const Loc loc{line_, col_};
    bump();  // the opening quote
    std::string value;
    while (true) {
      if (pos_ >= text_.size() || text_[pos_] == '\n') error_at(file_, loc, "unterminated string");
      const char c = text_[pos_];
      if (c == '"') {
        bump();
        break;
      }
      if (c != '\\') {
        value += c;
        bump();
        continue;
      }
      const Loc escape_loc{line_, col_};
      const char e = peek(1);
      if (e == '"' || e == '\\') {
        value += e;
      } else if (e == 'n') {
        value += '\n';
      } else if (e == 't') {
        value += '\t';
      } else if (e == 'x' && hex_value(peek(2)) >= 0 && hex_value(peek(3)) >= 0) {
        value += static_cast<char>(hex_value(peek(2)) * 16 + hex_value(peek(3)));
        bump();
        bump();
      } else if (e == '\0' && pos_ + 1 >= text_.size()) {
        error_at(file_, loc, "unterminated string");
      } else {
        const size_t len = e == 'x' ? 4 : 2;
        error_at(file_, escape_loc,
                 fmt::format("invalid escape '{}' in string", display(text_.substr(pos_, len))));
      }
      bump();
      bump();
    }
    tok->kind = Tok::kString;
    tok->str = std::move(value);
  }

  std::string_view text_;
  const std::string& file_;
  size_t pos_ = 0;
  int line_ = 1;
  int col_ = 1;
};

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_digit(c)) return false;
  return true;
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& file) : file_(file), lexer_(text, file) {
    advance();
  }

  Module parse_module() {
    Module m;
    if (!is_keyword("module")) expected("'module'");
    advance();
    if (tok_.kind != Tok::kGlobal) expected("module name (@NAME) after 'module'");
    m.name = tok_.str;
    advance();
    expect_punct("{", fmt::format("after module name '@{}'", m.name));
    while (true) {
      if (is_punct("}")) {
        advance();
        break;
      }
      if (is_keyword("config")) {
        parse_config(&m);
      } else if (is_keyword("symbol")) {
        parse_symbol(&m);
      } else if (is_keyword("weight")) {
        parse_weight(&m);
      } else if (is_keyword("source")) {
        parse_source(&m);
      } else if (is_keyword("func")) {
        parse_function(&m);
      } else if (tok_.kind == Tok::kEof) {
        expected("'}'");
      } else {
        expected("'config', 'symbol', 'weight', 'source', 'func' or '}'");
      }
    }
    if (tok_.kind != Tok::kEof) expected("end of input after the module");
    return m;
  }

 private:
  void advance() { tok_ = lexer_.next(); }

  bool is_punct(std::string_view p) const { return tok_.kind == Tok::kPunct && tok_.text == p; }
  bool is_keyword(std::string_view k) const { return tok_.kind == Tok::kIdent && tok_.text == k; }

  [[noreturn]] void error(Loc loc, const std::string& message) const {
    error_at(file_, loc, message);
  }

  // Reports that the current token is not `what` (which may carry context).
  [[noreturn]] void expected(const std::string& what) const {
    if (tok_.kind == Tok::kEof) error(tok_.loc, "unexpected end of input, expected " + what);
    error(tok_.loc, fmt::format("expected {}, got '{}'", what, display(tok_.text)));
  }

  void expect_punct(std::string_view p, const std::string& context) {
    if (!is_punct(p)) expected(fmt::format("'{}' {}", p, context));
    advance();
  }

  // Parses a comma-separated list closed by `close` (consumed): `item` parses one element;
  // the list may be empty when `allow_empty`. Another token after an element is reported
  // as "expected ',' or '<close>' <where()>".
  template <typename Item, typename Where>
  void parse_list(std::string_view close, bool allow_empty, Item item, Where where) {
    if (allow_empty && is_punct(close)) {
      advance();
      return;
    }
    while (true) {
      item();
      if (is_punct(",")) {
        advance();
        continue;
      }
      if (is_punct(close)) {
        advance();
        return;
      }
      expected(fmt::format("',' or '{}' {}", close, where()));
    }
  }

  int64_t int_value(const Token& tok) const {
    int64_t v = 0;
    const char* first = tok.text.data();
    const char* last = first + tok.text.size();
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (ec == std::errc::result_out_of_range)
      error(tok.loc, fmt::format("integer literal '{}' is out of range", display(tok.text)));
    if (ec != std::errc() || ptr != last)
      error(tok.loc, fmt::format("invalid integer '{}'", display(tok.text)));
    return v;
  }

  double float_value(const Token& tok) const {
    if (tok.text == "inf") return std::numeric_limits<double>::infinity();
    if (tok.text == "-inf") return -std::numeric_limits<double>::infinity();
    if (tok.text == "nan") return std::numeric_limits<double>::quiet_NaN();
    double v = 0;
    const char* first = tok.text.data();
    const char* last = first + tok.text.size();
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (ec == std::errc::result_out_of_range)
      error(tok.loc, fmt::format("float literal '{}' is out of range", display(tok.text)));
    if (ec != std::errc() || ptr != last)
      error(tok.loc, fmt::format("invalid float '{}'", display(tok.text)));
    return v;
  }

  // An INT >= 0 (a size or an offset of the memory plan).
  int64_t parse_non_negative(const char* what, const std::string& context) {
    if (tok_.kind != Tok::kInt) expected(fmt::format("integer {}", context));
    const int64_t v = int_value(tok_);
    if (v < 0) error(tok_.loc, fmt::format("negative {} '{}'", what, v));
    advance();
    return v;
  }

  // config := 'config' '{' (IDENT '=' STRING (',' IDENT '=' STRING)*)? '}'
  void parse_config(Module* m) {
    advance();
    expect_punct("{", "after 'config'");
    std::string key;
    parse_list(
        "}", /*allow_empty=*/true,
        [&] {
          if (tok_.kind != Tok::kIdent) expected("config key");
          key = std::string(tok_.text);
          const Loc key_loc = tok_.loc;
          advance();
          expect_punct("=", fmt::format("after config key '{}'", key));
          if (tok_.kind != Tok::kString)
            expected(fmt::format("string value for config key '{}'", key));
          if (!m->config.emplace(key, tok_.str).second)
            error(key_loc, fmt::format("config key '{}' is defined twice", key));
          advance();
        },
        [&] { return fmt::format("after config key '{}'", key); });
  }

  // source := 'source' INT '=' STRING, numbered in order from 0
  void parse_source(Module* m) {
    advance();
    const Loc num_loc = tok_.loc;
    const int64_t n = parse_non_negative("source number", "after 'source'");
    if (n != static_cast<int64_t>(m->sources.size()))
      error(num_loc,
            fmt::format("source {} out of order, expected source {}", n, m->sources.size()));
    expect_punct("=", fmt::format("after 'source {}'", n));
    if (tok_.kind != Tok::kString) expected(fmt::format("string after 'source {} ='", n));
    m->sources.push_back(tok_.str);
    advance();
  }

  // src := 'src' '(' INT ':' INT (',' INT)? ')', indices into the module's sources
  ir::SourceLoc parse_src(const Module& m, const std::string& shown) {
    advance();
    expect_punct("(", fmt::format("after 'src' in '{}'", shown));
    ir::SourceLoc src;
    const auto index = [&](const char* what) {
      const Loc at = tok_.loc;
      const int64_t i = parse_non_negative(what, fmt::format("in 'src' of '{}'", shown));
      if (i >= static_cast<int64_t>(m.sources.size()))
        error(at, fmt::format("{} {} is not a declared source (the module has {})", what, i,
                              m.sources.size()));
      return static_cast<int32_t>(i);
    };
    src.file = index("source file");
    expect_punct(":", fmt::format("after the source file in 'src' of '{}'", shown));
    const Loc line_loc = tok_.loc;
    const int64_t line = parse_non_negative("source line", fmt::format("in 'src' of '{}'", shown));
    if (line < 1 || line > std::numeric_limits<int32_t>::max())
      error(line_loc, fmt::format("source line {} out of range", line));
    src.line = static_cast<int32_t>(line);
    if (is_punct(",")) {
      advance();
      src.scope = index("source scope");
    }
    expect_punct(")", fmt::format("after 'src' of '{}'", shown));
    return src;
  }

  // symbol := 'symbol' IDENT 'max' INT
  void parse_symbol(Module* m) {
    advance();
    if (tok_.kind != Tok::kIdent) expected("symbol name after 'symbol'");
    Symbol s;
    s.name = std::string(tok_.text);
    advance();
    if (!is_keyword("max")) expected(fmt::format("'max' after symbol '{}'", s.name));
    advance();
    if (tok_.kind != Tok::kInt) expected(fmt::format("integer maximum for symbol '{}'", s.name));
    s.max = int_value(tok_);
    advance();
    m->symbols.push_back(std::move(s));
  }

  // weight := 'weight' '@' NAME ':' type ('=' IDENT '(' '@' NAME (',' '@' NAME)* ')' attrs?)?
  void parse_weight(Module* m) {
    advance();
    if (tok_.kind != Tok::kGlobal) expected("weight name (@NAME) after 'weight'");
    Weight w;
    w.name = tok_.str;
    advance();
    expect_punct(":", fmt::format("after weight '@{}'", w.name));
    w.type = parse_type();
    if (is_punct("=")) {
      advance();
      WeightDerivation d;
      if (tok_.kind != Tok::kIdent)
        expected(fmt::format("derivation op after '=' in weight '@{}'", w.name));
      d.op = std::string(tok_.text);
      advance();
      expect_punct("(", fmt::format("after derivation op '{}'", d.op));
      parse_list(
          ")", /*allow_empty=*/false,
          [&] {
            if (tok_.kind != Tok::kGlobal)
              expected(fmt::format("weight name (@NAME) in derivation of '@{}'", w.name));
            d.inputs.push_back(tok_.str);
            advance();
          },
          [&] { return fmt::format("in derivation of '@{}'", w.name); });
      if (is_punct("{")) d.attrs = parse_attrs();
      w.derivation = std::move(d);
    }
    m->weights.push_back(std::move(w));
  }

  // type := DTYPE '[' (dim (',' dim)*)? ']'
  // dim := INT | (INT '*')? IDENT (('+' | '-') INT)?   e.g. 64, T, T+1, T-1, 2*T, 2*T+1
  TensorType parse_type() {
    TensorType t;
    if (tok_.kind != Tok::kIdent) expected("type");
    std::optional<DType> dtype = parse_dtype(tok_.text);
    if (!dtype) error(tok_.loc, fmt::format("unknown dtype '{}'", display(tok_.text)));
    t.dtype = *dtype;
    advance();
    expect_punct("[", fmt::format("after dtype '{}'", dtype_name(t.dtype)));
    parse_list(
        "]", /*allow_empty=*/true, [&] { t.shape.push_back(parse_dim()); },
        [] { return std::string("in shape"); });
    return t;
  }

  Dim parse_dim() {
    int64_t scale = 1;
    if (tok_.kind == Tok::kInt) {
      const Loc loc = tok_.loc;
      const int64_t v = int_value(tok_);
      if (v < 0) error(loc, fmt::format("negative dimension '{}'", v));
      advance();
      if (!is_punct("*")) return Dim::constant(v);
      if (v < 1)
        error(loc, fmt::format("the scale of a symbolic dimension must be >= 1, got {}", v));
      scale = v;
      advance();
      if (tok_.kind != Tok::kIdent) expected(fmt::format("symbol after '{}*'", v));
    } else if (tok_.kind != Tok::kIdent) {
      expected("dimension (integer or symbol)");
    }
    const std::string name(tok_.text);
    advance();
    int64_t offset = 0;
    if (is_punct("+") || is_punct("-")) {
      const bool minus = is_punct("-");
      advance();
      if (tok_.kind != Tok::kInt || int_value(tok_) < 0)
        expected(fmt::format("integer after '{}{}'", name, minus ? "-" : "+"));
      offset = minus ? -int_value(tok_) : int_value(tok_);
      advance();
    } else if (tok_.kind == Tok::kInt && tok_.text.starts_with("-")) {  // `T-1` lexes as T, -1
      offset = int_value(tok_);
      advance();
    }
    return Dim::affine(name, scale, offset);
  }

  // attrs := '{' (IDENT '=' attr (',' IDENT '=' attr)*)? '}'
  Attrs parse_attrs() {
    advance();  // '{'
    Attrs attrs;
    std::string key;
    parse_list(
        "}", /*allow_empty=*/true,
        [&] {
          if (tok_.kind != Tok::kIdent) expected("attribute name");
          key = std::string(tok_.text);
          const Loc key_loc = tok_.loc;
          advance();
          expect_punct("=", fmt::format("after attribute '{}'", key));
          AttrValue value = parse_attr_value(key);
          if (!attrs.emplace(key, std::move(value)).second)
            error(key_loc, fmt::format("attribute '{}' is defined twice", key));
        },
        [&] { return fmt::format("after attribute '{}'", key); });
    return attrs;
  }

  // attr := INT | FLOAT | STRING | '[' (INT (',' INT)*)? ']'
  AttrValue parse_attr_value(const std::string& key) {
    AttrValue value;
    if (tok_.kind == Tok::kInt) {
      value = int_value(tok_);
    } else if (tok_.kind == Tok::kFloat ||
               (tok_.kind == Tok::kIdent && (tok_.text == "inf" || tok_.text == "nan"))) {
      value = float_value(tok_);
    } else if (tok_.kind == Tok::kString) {
      value = tok_.str;
    } else if (is_punct("[")) {
      advance();
      std::vector<int64_t> list;
      parse_list(
          "]", /*allow_empty=*/true,
          [&] {
            if (tok_.kind != Tok::kInt)
              expected(fmt::format("integer in list for attribute '{}'", key));
            list.push_back(int_value(tok_));
            advance();
          },
          [&] { return fmt::format("in list for attribute '{}'", key); });
      return list;  // parse_list consumed the ']'
    } else {
      expected(fmt::format("value for attribute '{}'", key));
    }
    advance();
    return value;
  }

  // The value names of the function being parsed, as written (with numbers).
  struct Scope {
    std::map<std::string, ValueId, std::less<>> ids;
  };

  // Checks that the current value token is not defined yet.
  void check_new_value(const Scope& scope) const {
    if (scope.ids.count(tok_.str))
      error(tok_.loc, fmt::format("value '{}' is defined twice", tok_.text));
  }

  // Resolves the current value token.
  ValueId use_value(const Scope& scope) const {
    auto it = scope.ids.find(tok_.str);
    if (it == scope.ids.end())
      error(tok_.loc, fmt::format("use of undefined value '{}'", tok_.text));
    return it->second;
  }

  static std::string value_name(const std::string& written) {
    return all_digits(written) ? std::string() : written;
  }

  // func := 'func' '@' NAME '(' params ')' '->' '(' types ')' ('arena' INT)?
  //         '{' op* 'return' values '}'
  void parse_function(Module* m) {
    advance();
    if (tok_.kind != Tok::kGlobal) expected("function name (@NAME) after 'func'");
    Function f;
    f.name = tok_.str;
    const std::string fname = "'@" + f.name + "'";
    advance();
    expect_punct("(", "after function name " + fname);
    Scope scope;
    std::string shown;
    parse_list(
        ")", /*allow_empty=*/true,
        [&] {
          if (tok_.kind != Tok::kValue) expected("parameter name (%NAME) in function " + fname);
          check_new_value(scope);
          const std::string written = tok_.str;
          shown = std::string(tok_.text);
          advance();
          expect_punct(":", fmt::format("after parameter '{}'", shown));
          TensorType type = parse_type();
          scope.ids[written] = f.add_param(value_name(written), std::move(type));
        },
        [&] { return fmt::format("after parameter '{}'", shown); });
    expect_punct("->", "after the parameters of " + fname);
    expect_punct("(", "before the result types of " + fname);
    std::vector<TensorType> result_types;
    parse_list(
        ")", /*allow_empty=*/true, [&] { result_types.push_back(parse_type()); },
        [&] { return "in the result types of " + fname; });
    if (is_keyword("arena")) {
      advance();
      f.arena_bytes = parse_non_negative("arena size", "for 'arena' of " + fname);
    }
    expect_punct("{", "before the body of " + fname);
    while (true) {
      if (tok_.kind == Tok::kValue) {
        parse_op(*m, &f, &scope);
      } else if (is_keyword("return")) {
        parse_return(&f, scope, result_types);
        break;
      } else {
        expected("op or 'return' in function " + fname);
      }
    }
    m->functions.push_back(std::move(f));
  }

  // op := value '=' OPNAME '(' (value (',' value)*)? ')' attrs? ':' type 'fused'? ('at' INT)?
  void parse_op(const Module& m, Function* f, Scope* scope) {
    check_new_value(*scope);
    const std::string written = tok_.str;
    const std::string shown(tok_.text);
    const Loc loc = tok_.loc;
    advance();
    expect_punct("=", fmt::format("after '{}'", shown));
    if (tok_.kind != Tok::kIdent) expected("op name after '='");
    std::optional<OpKind> kind = parse_op_kind(tok_.text);
    if (!kind) error(tok_.loc, fmt::format("unknown op '{}'", display(tok_.text)));
    const std::string op(tok_.text);
    advance();
    expect_punct("(", fmt::format("after op name '{}'", op));
    std::vector<ValueId> operands;
    parse_list(
        ")", /*allow_empty=*/true,
        [&] {
          if (tok_.kind != Tok::kValue) expected(fmt::format("operand (%NAME) of '{}'", op));
          operands.push_back(use_value(*scope));
          advance();
        },
        [&] { return fmt::format("after operand of '{}'", op); });
    Attrs attrs;
    if (is_punct("{")) attrs = parse_attrs();
    expect_punct(":", fmt::format("before the result type of '{}'", shown));
    TensorType type = parse_type();
    const bool fused = is_keyword("fused");
    if (fused) advance();
    int64_t arena_offset = -1;
    if (is_keyword("at")) {
      advance();
      arena_offset = parse_non_negative("arena offset", fmt::format("after 'at' in '{}'", shown));
    }
    ir::SourceLoc src;
    if (is_keyword("src")) src = parse_src(m, shown);
    const ValueId id =
        f->add_op(*kind, std::move(operands), std::move(type), std::move(attrs), loc);
    f->values[id].name = value_name(written);
    f->ops.back().arena_offset = arena_offset;
    f->ops.back().fused = fused;
    f->ops.back().src = src;
    scope->ids[written] = id;
  }

  // 'return' value (',' value)* '}'
  void parse_return(Function* f, const Scope& scope, const std::vector<TensorType>& types) {
    const Loc return_loc = tok_.loc;
    advance();
    if (tok_.kind == Tok::kValue) {
      while (true) {
        if (tok_.kind != Tok::kValue) expected("return value (%NAME) after ','");
        const ValueId id = use_value(scope);
        const size_t i = f->results.size();
        if (i < types.size() && !(f->type(id) == types[i]))
          error(tok_.loc,
                fmt::format("return value '{}' has type {}, but the signature of '@{}' "
                            "declares {}",
                            tok_.text, to_string(f->type(id)), f->name, to_string(types[i])));
        f->results.push_back(id);
        advance();
        if (!is_punct(",")) break;
        advance();
      }
      if (!is_punct("}")) expected("',' or '}' after return value");
    } else if (!is_punct("}")) {
      expected("return value (%NAME) or '}' after 'return'");
    }
    if (f->results.size() != types.size())
      error(return_loc, fmt::format("'@{}' returns {} value(s), but its signature declares {}",
                                    f->name, f->results.size(), types.size()));
    advance();
  }

  const std::string& file_;
  Lexer lexer_;
  Token tok_;
};

}  // namespace

Module parse_module(std::string_view text, const std::string& file) {
  return Parser(text, file).parse_module();
}

Module parse_and_verify(std::string_view text, const std::string& file) {
  Module m = parse_module(text, file);
  verify_or_throw(m, file);
  return m;
}

}  // namespace kiln::ir
