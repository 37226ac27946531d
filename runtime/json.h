// kiln::json: a small, strict JSON parser (RFC 8259) for untrusted input such as
// safetensors headers.
//
// - Objects keep their key order (a vector of pairs); a duplicate key is an error.
// - Numbers without a fraction or exponent are integers (int64, overflow is an error);
//   others are doubles.
// - Strings must be valid UTF-8; escapes, including \uXXXX surrogate pairs, are decoded
//   to UTF-8. Lone surrogates and unescaped control characters are errors.
// - Nesting is limited (64 levels by default); trailing non-whitespace is an error.
// Every parse error is a json::ParseError (a kiln::Error) carrying the byte offset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "support/error.h"

namespace kiln::json {

enum class Kind { null, boolean, integer, number, string, array, object };

// "null", "boolean", "integer", "number", "string", "array", "object".
const char* kind_name(Kind kind);

class Value {
 public:
  using Array = std::vector<Value>;
  using Member = std::pair<std::string, Value>;
  using Object = std::vector<Member>;

  Value() = default;  // null
  static Value of_bool(bool b);
  static Value of_int(int64_t i);
  static Value of_double(double d);
  static Value of_string(std::string s);
  static Value of_array(Array a);
  static Value of_object(Object o);

  Kind kind() const { return kind_; }
  bool is_null() const { return kind_ == Kind::null; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }
  // True for integers and non-integer numbers alike.
  bool is_number() const { return kind_ == Kind::integer || kind_ == Kind::number; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }

  // Accessors throw kiln::Error ("json value is a string, expected an integer") on a
  // kind mismatch. as_double accepts integers too.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;

  // The member named `key` of an object, or nullptr if absent. Throws if not an object.
  const Value* find(std::string_view key) const;

 private:
  void expect(Kind kind) const;

  Kind kind_ = Kind::null;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  Array array_;
  Object object_;
};

// A syntax error at a byte offset of the parsed text. what() is
// "invalid json: <detail> at byte <offset>".
class ParseError : public Error {
 public:
  ParseError(std::string detail, size_t offset);
  const std::string& detail() const { return detail_; }
  size_t offset() const { return offset_; }

 private:
  std::string detail_;
  size_t offset_;
};

inline constexpr size_t kDefaultMaxDepth = 64;

// Parses a complete JSON text (surrounding whitespace allowed). Throws ParseError.
Value parse(std::string_view text, size_t max_depth = kDefaultMaxDepth);

// `s` as a JSON string literal, quotes included. Control characters, '"' and '\' are
// escaped; other bytes are copied as they are (the caller supplies UTF-8).
std::string quote(std::string_view s);

// Compact JSON text for `value` (no whitespace). Non-finite doubles are an error.
std::string dump(const Value& value);

}  // namespace kiln::json
