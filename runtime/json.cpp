#include "runtime/json.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>
#include <unordered_set>

#include <fmt/format.h>

namespace kiln::json {

const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::null:
      return "null";
    case Kind::boolean:
      return "boolean";
    case Kind::integer:
      return "integer";
    case Kind::number:
      return "number";
    case Kind::string:
      return "string";
    case Kind::array:
      return "array";
    case Kind::object:
      return "object";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------
// Value

Value Value::of_bool(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.bool_ = b;
  return v;
}

Value Value::of_int(int64_t i) {
  Value v;
  v.kind_ = Kind::integer;
  v.int_ = i;
  return v;
}

Value Value::of_double(double d) {
  Value v;
  v.kind_ = Kind::number;
  v.double_ = d;
  return v;
}

Value Value::of_string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.string_ = std::move(s);
  return v;
}

Value Value::of_array(Array a) {
  Value v;
  v.kind_ = Kind::array;
  v.array_ = std::move(a);
  return v;
}

Value Value::of_object(Object o) {
  Value v;
  v.kind_ = Kind::object;
  v.object_ = std::move(o);
  return v;
}

namespace {
const char* article(Kind kind) {
  return kind == Kind::array || kind == Kind::object || kind == Kind::integer ? "an" : "a";
}
}  // namespace

void Value::expect(Kind kind) const {
  if (kind_ != kind) {
    fail("json value is {} {}, expected {} {}", article(kind_), kind_name(kind_), article(kind),
         kind_name(kind));
  }
}

bool Value::as_bool() const {
  expect(Kind::boolean);
  return bool_;
}

int64_t Value::as_int() const {
  expect(Kind::integer);
  return int_;
}

double Value::as_double() const {
  if (kind_ == Kind::integer) return static_cast<double>(int_);
  expect(Kind::number);
  return double_;
}

const std::string& Value::as_string() const {
  expect(Kind::string);
  return string_;
}

const Value::Array& Value::as_array() const {
  expect(Kind::array);
  return array_;
}

const Value::Object& Value::as_object() const {
  expect(Kind::object);
  return object_;
}

const Value* Value::find(std::string_view key) const {
  for (const Member& m : as_object()) {
    if (m.first == key) return &m.second;
  }
  return nullptr;
}

// ---------------------------------------------------------------------------------------
// ParseError

ParseError::ParseError(std::string detail, size_t offset)
    : Error(fmt::format("invalid json: {} at byte {}", detail, offset)),
      detail_(std::move(detail)),
      offset_(offset) {}

// ---------------------------------------------------------------------------------------
// Parser

namespace {

// A short, printable rendering of byte `c` for messages.
std::string describe_byte(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) {
    if (c == '\'') return "character '\\''";
    return fmt::format("character '{}'", static_cast<char>(c));
  }
  return fmt::format("byte 0x{:02x}", c);
}

// Text of at most `limit` bytes for messages.
std::string clip(std::string_view s, size_t limit = 40) {
  if (s.size() <= limit) return std::string(s);
  return std::string(s.substr(0, limit)) + "...";
}

class Parser {
 public:
  Parser(std::string_view text, size_t max_depth) : text_(text), max_depth_(max_depth) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) {
      error(fmt::format("unexpected {} after the json value", describe_byte(peek())), pos_);
    }
    return v;
  }

 private:
  [[noreturn]] void error(std::string detail, size_t offset) {
    throw ParseError(std::move(detail), offset);
  }

  [[noreturn]] void unexpected(const char* expected) {
    if (pos_ >= text_.size())
      error(fmt::format("unexpected end of input, expected {}", expected), pos_);
    error(fmt::format("unexpected {}, expected {}", describe_byte(peek()), expected), pos_);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  unsigned char peek() const { return static_cast<unsigned char>(text_[pos_]); }

  void skip_ws() {
    while (pos_ < text_.size()) {
      char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  Value parse_value(size_t depth) {
    if (at_end()) unexpected("a json value");
    switch (peek()) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return Value::of_string(parse_string());
      case 't':
        expect_literal("true");
        return Value::of_bool(true);
      case 'f':
        expect_literal("false");
        return Value::of_bool(false);
      case 'n':
        expect_literal("null");
        return Value();
      default:
        break;
    }
    if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
    unexpected("a json value");
  }

  void expect_literal(std::string_view literal) {
    if (text_.substr(pos_, literal.size()) != literal) {
      error(fmt::format("invalid literal, expected '{}'", literal), pos_);
    }
    pos_ += literal.size();
  }

  void check_depth(size_t depth) {
    if (depth > max_depth_) error(fmt::format("nesting deeper than {} levels", max_depth_), pos_);
  }

  Value parse_object(size_t depth) {
    check_depth(depth);
    ++pos_;  // '{'
    Value::Object members;
    std::unordered_set<std::string> keys;
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return Value::of_object(std::move(members));
    }
    while (true) {
      skip_ws();
      if (at_end() || peek() != '"') unexpected("a string key");
      size_t key_offset = pos_;
      std::string key = parse_string();
      if (!keys.insert(key).second) {
        error(fmt::format("duplicate key \"{}\"", clip(key)), key_offset);
      }
      skip_ws();
      if (at_end() || peek() != ':') unexpected("':'");
      ++pos_;
      skip_ws();
      Value v = parse_value(depth);
      members.emplace_back(std::move(key), std::move(v));
      skip_ws();
      if (at_end()) unexpected("',' or '}'");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        return Value::of_object(std::move(members));
      }
      unexpected("',' or '}'");
    }
  }

  Value parse_array(size_t depth) {
    check_depth(depth);
    ++pos_;  // '['
    Value::Array items;
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return Value::of_array(std::move(items));
    }
    while (true) {
      skip_ws();
      items.push_back(parse_value(depth));
      skip_ws();
      if (at_end()) unexpected("',' or ']'");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        return Value::of_array(std::move(items));
      }
      unexpected("',' or ']'");
    }
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  // Four hex digits at pos_ (after "\u").
  uint32_t parse_hex4(size_t escape_offset) {
    if (text_.size() - pos_ < 4) error("truncated \\u escape", escape_offset);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_ + i];
      uint32_t d;
      if (c >= '0' && c <= '9') {
        d = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        d = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        d = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        error("invalid hex digit in \\u escape", pos_ + i);
      }
      v = v * 16 + d;
    }
    pos_ += 4;
    return v;
  }

  // Validates one UTF-8 encoded code point starting at pos_ (a byte >= 0x80) and
  // advances past it.
  void skip_utf8_sequence() {
    size_t start = pos_;
    unsigned char c = peek();
    size_t len;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      error(fmt::format("invalid utf-8 lead byte 0x{:02x} in string", c), start);
    }
    if (text_.size() - start < len) error("truncated utf-8 sequence in string", start);
    for (size_t i = 1; i < len; ++i) {
      unsigned char cc = static_cast<unsigned char>(text_[start + i]);
      if ((cc & 0xc0) != 0x80) {
        error(fmt::format("invalid utf-8 continuation byte 0x{:02x} in string", cc), start + i);
      }
      cp = (cp << 6) | (cc & 0x3f);
    }
    bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong) error("overlong utf-8 sequence in string", start);
    if (cp >= 0xd800 && cp <= 0xdfff) error("utf-8 encoded surrogate in string", start);
    if (cp > 0x10ffff) error("utf-8 code point above U+10FFFF in string", start);
    pos_ += len;
  }

  std::string parse_string() {
    size_t open = pos_;
    ++pos_;  // '"'
    std::string out;
    while (true) {
      // Copy a run of plain bytes.
      size_t run = pos_;
      while (pos_ < text_.size()) {
        unsigned char c = peek();
        if (c == '"' || c == '\\' || c < 0x20) break;
        if (c >= 0x80) {
          skip_utf8_sequence();
        } else {
          ++pos_;
        }
      }
      out.append(text_.substr(run, pos_ - run));
      if (at_end()) error("unterminated string", open);
      unsigned char c = peek();
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (c < 0x20) error(fmt::format("unescaped control byte 0x{:02x} in string", c), pos_);
      // Escape.
      size_t escape = pos_;
      ++pos_;
      if (at_end()) error("unterminated string", open);
      char e = text_[pos_++];
      switch (e) {
        case '"':
          out.push_back('"');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '/':
          out.push_back('/');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          uint32_t cp = parse_hex4(escape);
          if (cp >= 0xdc00 && cp <= 0xdfff) error("lone low surrogate in \\u escape", escape);
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (text_.substr(pos_, 2) != "\\u") {
              error("high surrogate not followed by a low surrogate escape", escape);
            }
            size_t second = pos_;
            pos_ += 2;
            uint32_t lo = parse_hex4(second);
            if (lo < 0xdc00 || lo > 0xdfff) {
              error("high surrogate not followed by a low surrogate escape", escape);
            }
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          error(fmt::format(
                    "invalid escape '\\{}' in string",
                    static_cast<unsigned char>(e) >= 0x20 && static_cast<unsigned char>(e) < 0x7f
                        ? std::string(1, e)
                        : fmt::format("x{:02x}", static_cast<unsigned char>(e))),
                escape);
      }
    }
  }

  // Whether a valid JSON number literal has an absolute value below 1 (zero included),
  // decided from its digits and exponent without floating point. Needed because
  // from_chars leaves the value unset on both overflow and underflow.
  static bool magnitude_below_one(std::string_view literal) {
    size_t p = 0;
    if (literal[p] == '-') ++p;
    // Decimal exponent of the first non-zero digit, relative to the decimal point.
    int64_t lead = 0;
    bool found = false;
    size_t int_start = p;
    while (p < literal.size() && literal[p] >= '0' && literal[p] <= '9') ++p;
    const int64_t int_digits = static_cast<int64_t>(p - int_start);
    for (size_t i = int_start; i < p && !found; ++i) {
      if (literal[i] != '0') {
        lead = int_digits - static_cast<int64_t>(i - int_start) - 1;
        found = true;
      }
    }
    if (p < literal.size() && literal[p] == '.') {
      ++p;
      size_t frac_start = p;
      while (p < literal.size() && literal[p] >= '0' && literal[p] <= '9') {
        if (!found && literal[p] != '0') {
          lead = -static_cast<int64_t>(p - frac_start) - 1;
          found = true;
        }
        ++p;
      }
    }
    if (!found) return true;  // all digits zero
    int64_t exponent = 0;
    if (p < literal.size() && (literal[p] == 'e' || literal[p] == 'E')) {
      ++p;
      bool exp_negative = false;
      if (literal[p] == '+' || literal[p] == '-') exp_negative = literal[p++] == '-';
      for (; p < literal.size(); ++p) {
        if (exponent < 1'000'000'000) exponent = exponent * 10 + (literal[p] - '0');  // saturate
      }
      if (exp_negative) exponent = -exponent;
    }
    // lead is bounded by the literal's length, exponent by the saturation: no overflow.
    return lead + exponent < 0;
  }

  bool digit_at(size_t p) const { return p < text_.size() && text_[p] >= '0' && text_[p] <= '9'; }

  Value parse_number() {
    size_t start = pos_;
    bool negative = false;
    if (peek() == '-') {
      negative = true;
      ++pos_;
    }
    if (!digit_at(pos_)) error("invalid number: expected a digit", pos_);
    if (text_[pos_] == '0') {
      ++pos_;
      if (digit_at(pos_)) error("invalid number: leading zero", start);
    } else {
      while (digit_at(pos_)) ++pos_;
    }
    size_t int_end = pos_;
    bool is_integer = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      is_integer = false;
      ++pos_;
      if (!digit_at(pos_)) error("invalid number: expected a digit after '.'", pos_);
      while (digit_at(pos_)) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      is_integer = false;
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digit_at(pos_)) error("invalid number: expected a digit in the exponent", pos_);
      while (digit_at(pos_)) ++pos_;
    }
    std::string_view literal = text_.substr(start, pos_ - start);

    if (is_integer) {
      // Accumulate the magnitude in uint64 with overflow checks.
      const uint64_t limit =
          negative ? uint64_t{1} << 63 : static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
      uint64_t magnitude = 0;
      for (size_t p = start + (negative ? 1 : 0); p < int_end; ++p) {
        uint64_t d = static_cast<uint64_t>(text_[p] - '0');
        if (magnitude > (limit - d) / 10) {
          error(fmt::format("integer {} out of the int64 range", clip(literal)), start);
        }
        magnitude = magnitude * 10 + d;
      }
      int64_t value;
      if (negative) {
        // -magnitude without overflow, including INT64_MIN.
        value = magnitude == (uint64_t{1} << 63) ? std::numeric_limits<int64_t>::min()
                                                 : -static_cast<int64_t>(magnitude);
      } else {
        value = static_cast<int64_t>(magnitude);
      }
      return Value::of_int(value);
    }

    double d = 0.0;
    auto [ptr, ec] = std::from_chars(literal.data(), literal.data() + literal.size(), d);
    if (ec == std::errc::result_out_of_range && magnitude_below_one(literal)) {
      // Underflow: the value rounds to zero (with the literal's sign), as strtod does.
      d = negative ? -0.0 : 0.0;
    } else if (ec != std::errc() || ptr != literal.data() + literal.size() || !std::isfinite(d)) {
      error(fmt::format("number {} out of the double range", clip(literal)), start);
    }
    return Value::of_double(d);
  }

  std::string_view text_;
  size_t max_depth_;
  size_t pos_ = 0;
};

void dump_to(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::null:
      out += "null";
      return;
    case Kind::boolean:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::integer:
      out += fmt::format("{}", v.as_int());
      return;
    case Kind::number: {
      double d = v.as_double();
      if (!std::isfinite(d)) fail("json cannot represent the non-finite number {}", d);
      std::string s = fmt::format("{}", d);
      // Keep it a number that reads back as a non-integer ("1" -> "1.0").
      if (s.find_first_of(".eE") == std::string::npos) s += ".0";
      out += s;
      return;
    }
    case Kind::string:
      out += quote(v.as_string());
      return;
    case Kind::array: {
      out.push_back('[');
      bool first = true;
      for (const Value& item : v.as_array()) {
        if (!first) out.push_back(',');
        first = false;
        dump_to(out, item);
      }
      out.push_back(']');
      return;
    }
    case Kind::object: {
      out.push_back('{');
      bool first = true;
      for (const auto& [key, item] : v.as_object()) {
        if (!first) out.push_back(',');
        first = false;
        out += quote(key);
        out.push_back(':');
        dump_to(out, item);
      }
      out.push_back('}');
      return;
    }
  }
}

}  // namespace

Value parse(std::string_view text, size_t max_depth) {
  return Parser(text, max_depth).parse_document();
}

std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20) {
          out += fmt::format("\\u{:04x}", u);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
  return out;
}

std::string dump(const Value& value) {
  std::string out;
  dump_to(out, value);
  return out;
}

}  // namespace kiln::json
