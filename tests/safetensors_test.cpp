// Tests for runtime/json and runtime/safetensors: round trips, and one crafted bad file per
// validation rule, each checked against the text of its error.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.h"
#include "runtime/json.h"
#include "runtime/safetensors.h"
#include "support/error.h"

namespace kiln::rt {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;
using ::testing::Pair;

using kiln::testing::error_of;

// A safetensors file from a header text and a data section, with a correct length prefix.
std::vector<uint8_t> file_bytes(const std::string& header, size_t data_size = 0) {
  std::vector<uint8_t> out;
  uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(len >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_size; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

// The error of loading a file made from `header` and `data_size` data bytes.
std::string load_error(const std::string& header, size_t data_size = 0) {
  return error_of(
      [&] { SafeTensors::from_bytes(file_bytes(header, data_size), "bad.safetensors"); });
}

// ---------------------------------------------------------------------------------------
// Round trips and the happy path

TEST(SafeTensorsTest, RoundTripSerializeFromBytes) {
  std::vector<TensorData> tensors = {
      make_f32("layer.weight", {2, 3}, {1.f, -2.f, 3.5f, 0.f, 1e-3f, 6.f}),
      make_i64("ids", {4},
               {0, -1, std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}),
      make_f32("scalar", {}, {42.f}),
      make_f32("empty", {0, 5}, {}),
  };
  std::vector<uint8_t> bytes =
      serialize_safetensors(tensors, {{"format", "pt"}, {"note", "quote \" and \\ and \n"}});

  // The header is padded with spaces to a multiple of 8 bytes.
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + header_len + 24 + 32 + 4);

  SafeTensors st = SafeTensors::from_bytes(std::move(bytes), "mem");
  EXPECT_EQ(st.label(), "mem");
  ASSERT_EQ(st.tensors().size(), 4u);
  EXPECT_EQ(st.tensors()[0].name, "layer.weight");
  EXPECT_EQ(st.tensors()[1].name, "ids");
  EXPECT_EQ(st.tensors()[2].name, "scalar");
  EXPECT_EQ(st.tensors()[3].name, "empty");

  const TensorInfo& w = st.at("layer.weight");
  EXPECT_EQ(w.dtype, DType::f32);
  EXPECT_THAT(w.shape, ElementsAre(2, 3));
  EXPECT_EQ(w.numel(), 6);
  EXPECT_EQ(w.begin, 0u);
  EXPECT_EQ(w.end, 24u);
  EXPECT_EQ(st.bytes(w).size(), 24u);
  EXPECT_THAT(st.to_f32(w), ElementsAre(1.f, -2.f, 3.5f, 0.f, 1e-3f, 6.f));

  const TensorInfo& ids = st.at("ids");
  EXPECT_EQ(ids.dtype, DType::i64);
  EXPECT_THAT(st.to_i64(ids), ElementsAre(0, -1, std::numeric_limits<int64_t>::max(),
                                          std::numeric_limits<int64_t>::min()));

  const TensorInfo& scalar = st.at("scalar");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_THAT(st.to_f32(scalar), ElementsAre(42.f));

  const TensorInfo& empty = st.at("empty");
  EXPECT_EQ(empty.numel(), 0);
  EXPECT_EQ(empty.nbytes(), 0u);
  EXPECT_TRUE(st.to_f32(empty).empty());

  EXPECT_THAT(st.metadata(),
              ElementsAre(Pair("format", "pt"), Pair("note", "quote \" and \\ and \n")));
  EXPECT_EQ(st.find("nope"), nullptr);
  EXPECT_EQ(st.find("ids"), &ids);
}

TEST(SafeTensorsTest, RoundTripThroughFile) {
  std::string path = ::testing::TempDir() + "/kiln_safetensors_roundtrip.safetensors";
  write_safetensors(path, {make_f32("a", {3}, {1.f, 2.f, 3.f}), make_i64("b", {1, 2}, {7, 8})},
                    {{"k", "v"}});
  SafeTensors st = SafeTensors::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(st.label(), path);
  EXPECT_THAT(st.to_f32(st.at("a")), ElementsAre(1.f, 2.f, 3.f));
  EXPECT_THAT(st.to_i64(st.at("b")), ElementsAre(7, 8));
  EXPECT_THAT(st.metadata(), ElementsAre(Pair("k", "v")));
}

TEST(SafeTensorsTest, EmptyFileRoundTrips) {
  std::vector<uint8_t> bytes = serialize_safetensors({});
  EXPECT_EQ(bytes.size(), 16u);  // "{}" padded to 8 bytes
  SafeTensors st = SafeTensors::from_bytes(std::move(bytes), "empty");
  EXPECT_TRUE(st.tensors().empty());
  EXPECT_TRUE(st.metadata().empty());
}

TEST(SafeTensorsTest, AllDTypesNamedAndSized) {
  struct Case {
    DType dtype;
    const char* name;
    size_t size;
  };
  for (Case c :
       {Case{DType::f32, "F32", 4}, Case{DType::f16, "F16", 2}, Case{DType::bf16, "BF16", 2},
        Case{DType::f64, "F64", 8}, Case{DType::i64, "I64", 8}, Case{DType::i32, "I32", 4},
        Case{DType::i16, "I16", 2}, Case{DType::i8, "I8", 1}, Case{DType::u8, "U8", 1},
        Case{DType::boolean, "BOOL", 1}}) {
    EXPECT_STREQ(dtype_name(c.dtype), c.name);
    EXPECT_EQ(dtype_size(c.dtype), c.size);
    EXPECT_EQ(dtype_from_name(c.name), c.dtype);
    // Each loads from a file.
    std::string header = fmt::format(
        R"({{"t":{{"dtype":"{}","shape":[3],"data_offsets":[0,{}]}}}})", c.name, 3 * c.size);
    SafeTensors st = SafeTensors::from_bytes(file_bytes(header, 3 * c.size), "dt");
    EXPECT_EQ(st.at("t").dtype, c.dtype);
  }
  EXPECT_EQ(dtype_from_name("F12"), std::nullopt);
  EXPECT_EQ(dtype_from_name("f32"), std::nullopt);
}

TEST(SafeTensorsTest, ZeroSizeTensorsAndUncoveredBytesAreAllowed) {
  // Two empty tensors at the same offset inside another tensor's range, and 8 data bytes
  // that no tensor covers. Whitespace around the header is allowed (it is padding).
  std::string header = R"(  {"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("e1":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                       R"("e2":{"data_offsets":[4,4],"shape":[3,0],"dtype":"I64"}}   )";
  SafeTensors st = SafeTensors::from_bytes(file_bytes(header, 16), "ok");
  ASSERT_EQ(st.tensors().size(), 3u);
  EXPECT_EQ(st.at("e2").numel(), 0);
  EXPECT_TRUE(st.to_i64(st.at("e2")).empty());
}

TEST(SafeTensorsTest, AtMissingTensorNamesIt) {
  SafeTensors st = SafeTensors::from_bytes(serialize_safetensors({make_f32("a", {1}, {1.f})}),
                                           "model.safetensors");
  EXPECT_EQ(error_of([&] { st.at("b.weight"); }),
            "safetensors 'model.safetensors' has no tensor 'b.weight'");
}

TEST(SafeTensorsTest, ToI64FromI32SignExtends) {
  std::vector<int32_t> values = {0, 1, -1, std::numeric_limits<int32_t>::max(),
                                 std::numeric_limits<int32_t>::min()};
  TensorData t{"ids", DType::i32, {5}, std::vector<uint8_t>(values.size() * 4)};
  std::memcpy(t.data.data(), values.data(), t.data.size());
  SafeTensors st = SafeTensors::from_bytes(serialize_safetensors({t}), "i32");
  EXPECT_THAT(st.to_i64(st.at("ids")), ElementsAre(0, 1, -1, std::numeric_limits<int32_t>::max(),
                                                   std::numeric_limits<int32_t>::min()));
}

TEST(SafeTensorsTest, ToF32OnI64IsAnError) {
  SafeTensors st =
      SafeTensors::from_bytes(serialize_safetensors({make_i64("ids", {2}, {1, 2})}), "w.st");
  EXPECT_EQ(error_of([&] { st.to_f32(st.at("ids")); }),
            "safetensors 'w.st': tensor 'ids' has dtype I64, expected F32");
}

TEST(SafeTensorsTest, ToI64OnF32IsAnError) {
  SafeTensors st =
      SafeTensors::from_bytes(serialize_safetensors({make_f32("x", {2}, {1.f, 2.f})}), "w.st");
  EXPECT_EQ(error_of([&] { st.to_i64(st.at("x")); }),
            "safetensors 'w.st': tensor 'x' has dtype F32, expected I64 or I32");
}

TEST(SafeTensorsTest, BytesOfForeignTensorInfoIsChecked) {
  SafeTensors st =
      SafeTensors::from_bytes(serialize_safetensors({make_f32("x", {2}, {1.f, 2.f})}), "w.st");
  TensorInfo bogus{"x", DType::f32, {100}, 0, 400};
  EXPECT_EQ(error_of([&] { st.bytes(bogus); }),
            "safetensors 'w.st': tensor 'x' byte range [0, 400) is outside the data section of 8 "
            "bytes");
}

TEST(SafeTensorsTest, LoadNonexistentNamesPath) {
  std::string msg = error_of([] { SafeTensors::load("/nonexistent/model.safetensors"); });
  EXPECT_THAT(msg, AllOf(HasSubstr("cannot open safetensors file '/nonexistent/model.safetensors'"),
                         HasSubstr("No such file or directory")));
}

TEST(SafeTensorsTest, LoadDirectoryIsAnError) {
  std::string dir = ::testing::TempDir();
  EXPECT_EQ(error_of([&] { SafeTensors::load(dir); }),
            fmt::format("safetensors file '{}' is a directory", dir));
}

TEST(SafeTensorsTest, LoadValidatesFileContents) {
  std::string path = ::testing::TempDir() + "/kiln_safetensors_bad.safetensors";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite("abc", 1, 3, f);
    std::fclose(f);
  }
  std::string msg = error_of([&] { SafeTensors::load(path); });
  std::filesystem::remove(path);
  EXPECT_EQ(msg, fmt::format("safetensors '{}': file is 3 bytes, too short for the 8-byte header "
                             "length",
                             path));
}

// ---------------------------------------------------------------------------------------
// Serializer checks

TEST(SafeTensorsTest, MakeF32ChecksSize) {
  EXPECT_EQ(error_of([] {
              make_f32("w", {2, 3}, {1.f, 2.f});
            }),
            "make_f32: tensor 'w' shape [2,3] has 6 elements, but 2 values were given");
  EXPECT_EQ(error_of([] { make_i64("ids", {-1}, {}); }),
            "make_i64: tensor 'ids' shape [-1] has negative dimension -1");
}

TEST(SafeTensorsTest, SerializeRejectsBadTensors) {
  EXPECT_EQ(error_of([] {
              serialize_safetensors({make_f32("a", {1}, {1.f}), make_f32("a", {1}, {2.f})});
            }),
            "serialize_safetensors: duplicate tensor name 'a' (tensors 0 and 1)");
  EXPECT_EQ(error_of([] { serialize_safetensors({make_f32("__metadata__", {1}, {1.f})}); }),
            "serialize_safetensors: tensor 0 is named '__metadata__', which is reserved");
  EXPECT_EQ(error_of([] {
              serialize_safetensors({TensorData{"w", DType::f16, {3}, std::vector<uint8_t>(5)}});
            }),
            "serialize_safetensors: tensor 'w' has 5 bytes of data, but shape [3] with dtype F16 "
            "needs 6 bytes");
  EXPECT_THAT(error_of([] { serialize_safetensors({make_f32("bad\xff", {1}, {1.f})}); }),
              HasSubstr("tensor name 'bad\xff' is not valid utf-8"));
}

// ---------------------------------------------------------------------------------------
// Crafted bad files

TEST(SafeTensorsBadFileTest, ShorterThanLengthPrefix) {
  EXPECT_EQ(error_of([] {
              SafeTensors::from_bytes({1, 2, 3, 4, 5}, "t.st");
            }),
            "safetensors 't.st': file is 5 bytes, too short for the 8-byte header length");
  EXPECT_EQ(error_of([] { SafeTensors::from_bytes({}, "t.st"); }),
            "safetensors 't.st': file is 0 bytes, too short for the 8-byte header length");
}

TEST(SafeTensorsBadFileTest, DataSectionCutShort) {
  // A valid file with its last 4 bytes cut off.
  std::vector<uint8_t> bytes =
      serialize_safetensors({make_f32("a.weight", {2, 3}, {1, 2, 3, 4, 5, 6})});
  bytes.erase(bytes.end() - 4, bytes.end());
  EXPECT_THAT(error_of([&] { SafeTensors::from_bytes(bytes, "w.safetensors"); }),
              HasSubstr("safetensors 'w.safetensors': tensor 'a.weight' data offsets [0, 24) "
                        "exceed data section of 20 bytes"));
}

TEST(SafeTensorsBadFileTest, HeaderLengthLargerThanFile) {
  std::vector<uint8_t> bytes = file_bytes("{}", 20);  // 30 bytes in all
  bytes[0] = 0xe8;                                    // 1000
  bytes[1] = 0x03;
  EXPECT_EQ(error_of([&] { SafeTensors::from_bytes(bytes, "t.st"); }),
            "safetensors 't.st': header length 1000 exceeds the 22 bytes after the length prefix "
            "(file truncated?)");
}

TEST(SafeTensorsBadFileTest, HugeHeaderLength) {
  std::vector<uint8_t> bytes = file_bytes("{}");
  std::memset(bytes.data(), 0xff, 8);
  EXPECT_EQ(error_of([&] { SafeTensors::from_bytes(bytes, "t.st"); }),
            "safetensors 't.st': header length 18446744073709551615 exceeds the limit of "
            "100000000 bytes");
  // Just over the limit.
  uint64_t len = SafeTensors::kMaxHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<uint8_t>(len >> (8 * i));
  EXPECT_THAT(error_of([&] { SafeTensors::from_bytes(bytes, "t.st"); }),
              HasSubstr("header length 100000001 exceeds the limit of 100000000 bytes"));
}

TEST(SafeTensorsBadFileTest, InvalidJson) {
  EXPECT_EQ(load_error(R"({"a": )"),
            "safetensors 'bad.safetensors': header (6 bytes) is not valid json: unexpected end of "
            "input, expected a json value at header byte 6");
  EXPECT_EQ(load_error(R"({"a":1,})"),
            "safetensors 'bad.safetensors': header (8 bytes) is not valid json: unexpected "
            "character '}', expected a string key at header byte 7");
  EXPECT_THAT(load_error(""), HasSubstr("header (0 bytes) is not valid json: unexpected end of "
                                        "input"));
  EXPECT_THAT(load_error("{} x"), HasSubstr("is not valid json: unexpected character 'x' after "
                                            "the json value at header byte 3"));
  EXPECT_THAT(load_error(std::string("{}\0", 3)),
              HasSubstr("unexpected byte 0x00 after the json value at header byte 2"));
}

TEST(SafeTensorsBadFileTest, NonObjectHeader) {
  EXPECT_EQ(load_error("[1, 2]"),
            "safetensors 'bad.safetensors': header is a json array, expected an object");
  EXPECT_THAT(load_error("\"x\""), HasSubstr("header is a json string, expected an object"));
}

TEST(SafeTensorsBadFileTest, UnknownDtype) {
  EXPECT_EQ(load_error(R"({"w":{"dtype":"F12","shape":[1],"data_offsets":[0,4]}})", 4),
            "safetensors 'bad.safetensors': tensor 'w' has unknown dtype 'F12' (supported: F32, "
            "F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)");
  EXPECT_THAT(load_error(R"({"w":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 'w' dtype is a json integer"));
}

TEST(SafeTensorsBadFileTest, NegativeDimension) {
  EXPECT_EQ(load_error(R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})", 24),
            "safetensors 'bad.safetensors': tensor 'w' shape [2,-3] has negative dimension -3 at "
            "index 1");
}

TEST(SafeTensorsBadFileTest, NonIntegerDimension) {
  EXPECT_THAT(load_error(R"({"w":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", 8),
              HasSubstr("tensor 'w' shape dimension 0 is a json number, expected an integer"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"F32","shape":[1e1],"data_offsets":[0,40]}})", 40),
              HasSubstr("tensor 'w' shape dimension 0 is a json number, expected an integer"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})", 8),
              HasSubstr("tensor 'w' shape is a json string, expected an array of integers"));
  // Beyond int64: a json error.
  EXPECT_THAT(
      load_error(R"({"w":{"dtype":"F32","shape":[99999999999999999999],"data_offsets":[0,8]}})"),
      HasSubstr("integer 99999999999999999999 out of the int64 range at header byte 29"));
}

TEST(SafeTensorsBadFileTest, ShapeProductOverflow) {
  EXPECT_EQ(load_error(
                R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})"),
            "safetensors 'bad.safetensors': tensor 'w' shape [4294967296,4294967296,16] element "
            "count overflows int64");
  // A zero dimension anywhere makes the product zero, however large the others are.
  SafeTensors st = SafeTensors::from_bytes(
      file_bytes(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})"),
      "zero");
  EXPECT_EQ(st.at("w").numel(), 0);
}

TEST(SafeTensorsBadFileTest, ByteSizeOverflow) {
  // 2^60 elements fit int64, 2^60 * 8 bytes do not.
  EXPECT_EQ(load_error(R"({"w":{"dtype":"F64","shape":[1152921504606846976],)"
                       R"("data_offsets":[0,0]}})"),
            "safetensors 'bad.safetensors': tensor 'w' shape [1152921504606846976] with dtype F64 "
            "has 1152921504606846976 elements, whose byte size overflows int64");
}

TEST(SafeTensorsBadFileTest, DataOffsetsLengthMismatch) {
  EXPECT_EQ(load_error(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24),
            "safetensors 'bad.safetensors': tensor 'w' data offsets [0, 20) hold 20 bytes, but "
            "shape [2,3] with dtype F32 needs 24 bytes");
}

TEST(SafeTensorsBadFileTest, DataOffsetsMalformed) {
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0]}})", 4),
              HasSubstr("tensor 'w' data_offsets has 1 elements, expected 2 [begin, end]"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4,8]}})", 8),
              HasSubstr("tensor 'w' data_offsets has 3 elements, expected 2 [begin, end]"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":{"a":1}}})", 8),
              HasSubstr("tensor 'w' data_offsets is a json object, expected [begin, end]"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[-4,0]}})", 8),
              HasSubstr("tensor 'w' data_offsets[0] is -4, expected a non-negative integer"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4.0]}})", 8),
              HasSubstr("tensor 'w' data_offsets[1] is a json number, expected a non-negative "
                        "integer"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", 8),
              HasSubstr("tensor 'w' data offsets [8, 4) have begin after end"));
}

TEST(SafeTensorsBadFileTest, OffsetsOutOfRange) {
  EXPECT_EQ(load_error(R"({"a.weight":{"dtype":"F32","shape":[25],"data_offsets":[0,100]}})", 64),
            "safetensors 'bad.safetensors': tensor 'a.weight' data offsets [0, 100) exceed data "
            "section of 64 bytes");
  // Huge offsets whose difference is right must not wrap around.
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],)"
                         R"("data_offsets":[9223372036854775800,9223372036854775804]}})",
                         8),
              HasSubstr("tensor 'w' data offsets [9223372036854775800, 9223372036854775804) "
                        "exceed data section of 8 bytes"));
}

TEST(SafeTensorsBadFileTest, OverlappingTensors) {
  EXPECT_EQ(load_error(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                       24),
            "safetensors 'bad.safetensors': tensors 'a' [0, 16) and 'b' [8, 24) overlap");
  // Out of header order, and one tensor contained in a larger earlier one.
  EXPECT_THAT(load_error(R"({"c":{"dtype":"U8","shape":[4],"data_offsets":[20,24]},)"
                         R"("big":{"dtype":"U8","shape":[32],"data_offsets":[0,32]},)"
                         R"("b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})",
                         32),
              HasSubstr("tensors 'big' [0, 32) and 'b' [8, 12) overlap"));
  // Identical ranges.
  EXPECT_THAT(load_error(R"({"x":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("y":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})",
                         4),
              HasSubstr("tensors 'x' [0, 4) and 'y' [0, 4) overlap"));
}

TEST(SafeTensorsBadFileTest, DuplicateKey) {
  EXPECT_EQ(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                       R"("w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                       8),
            "safetensors 'bad.safetensors': header (105 bytes) is not valid json: duplicate key "
            "\"w\" at header byte 53");
  EXPECT_THAT(
      load_error(R"({"w":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 4),
      HasSubstr("duplicate key \"dtype\""));
}

TEST(SafeTensorsBadFileTest, EntryKeys) {
  EXPECT_THAT(load_error(R"({"w":[1,2]})"),
              HasSubstr("tensor 'w' entry is a json array, expected an object"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4]}})", 4),
              HasSubstr("tensor 'w' is missing 'data_offsets'"));
  EXPECT_THAT(load_error(R"({"w":{"shape":[4],"data_offsets":[0,4]}})", 4),
              HasSubstr("tensor 'w' is missing 'dtype'"));
  EXPECT_THAT(load_error(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"extra":1}})", 4),
              HasSubstr("tensor 'w' has unexpected key 'extra'"));
}

TEST(SafeTensorsBadFileTest, BadMetadata) {
  EXPECT_EQ(load_error(R"({"__metadata__":[1]})"),
            "safetensors 'bad.safetensors': __metadata__ is a json array, expected an object of "
            "strings");
  EXPECT_EQ(load_error(R"({"__metadata__":{"format":"pt","epoch":3}})"),
            "safetensors 'bad.safetensors': __metadata__ key 'epoch' has a json integer value, "
            "expected a string");
  EXPECT_THAT(load_error(R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})"),
              HasSubstr("duplicate key \"__metadata__\""));
}

TEST(SafeTensorsBadFileTest, DeepNesting) {
  std::string deep = R"({"__metadata__":)" + std::string(100, '[') + std::string(100, ']') + "}";
  EXPECT_THAT(load_error(deep), HasSubstr("nesting deeper than 64 levels at header byte 79"));
}

TEST(SafeTensorsBadFileTest, InvalidUtf8Name) {
  EXPECT_THAT(load_error("{\"w\xc3\x28\":{}}"),
              HasSubstr("invalid utf-8 continuation byte 0x28 in string at header byte 4"));
}

TEST(SafeTensorsBadFileTest, LongNameIsClippedInMessages) {
  std::string name(5000, 'n');
  std::string msg =
      load_error("{\"" + name + R"(":{"dtype":"F12","shape":[],"data_offsets":[0,0]}})");
  EXPECT_THAT(msg, HasSubstr("... (5000 bytes)' has unknown dtype 'F12'"));
  EXPECT_LT(msg.size(), 400u);
}

// ---------------------------------------------------------------------------------------
// JSON parser

std::string json_error(std::string_view text) {
  return error_of([&] { json::parse(text); });
}

TEST(JsonTest, ParsesAllKinds) {
  json::Value v = json::parse(R"( {"b":[true,false,null],"i":-42,"d":1.5e2,"s":"x","o":{}} )");
  ASSERT_TRUE(v.is_object());
  const json::Value::Object& o = v.as_object();
  ASSERT_EQ(o.size(), 5u);
  // Key order is kept.
  EXPECT_EQ(o[0].first, "b");
  EXPECT_EQ(o[1].first, "i");
  EXPECT_EQ(o[2].first, "d");
  EXPECT_EQ(o[3].first, "s");
  EXPECT_EQ(o[4].first, "o");
  const json::Value::Array& b = v.find("b")->as_array();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_TRUE(b[0].as_bool());
  EXPECT_FALSE(b[1].as_bool());
  EXPECT_TRUE(b[2].is_null());
  EXPECT_EQ(v.find("i")->as_int(), -42);
  EXPECT_EQ(v.find("d")->kind(), json::Kind::number);
  EXPECT_DOUBLE_EQ(v.find("d")->as_double(), 150.0);
  EXPECT_EQ(v.find("s")->as_string(), "x");
  EXPECT_TRUE(v.find("o")->as_object().empty());
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(error_of([&] { v.find("s")->as_int(); }),
            "json value is a string, expected an integer");
}

TEST(JsonTest, StringEscapes) {
  json::Value v = json::parse(R"("a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u20ac\ud83d\ude00\u0000")");
  EXPECT_EQ(v.as_string(),
            std::string("a\"b\\c/d\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0", 23));
  // Raw UTF-8 passes through.
  EXPECT_EQ(json::parse("\"\xc3\xa9\xf0\x9f\x98\x80\"").as_string(), "\xc3\xa9\xf0\x9f\x98\x80");
}

TEST(JsonTest, StringErrors) {
  EXPECT_EQ(json_error(R"("abc)"), "invalid json: unterminated string at byte 0");
  EXPECT_EQ(json_error("\"a\nb\""),
            "invalid json: unescaped control byte 0x0a in string at byte 2");
  EXPECT_EQ(json_error(R"("\x")"), "invalid json: invalid escape '\\x' in string at byte 1");
  EXPECT_EQ(json_error(R"("\u12G4")"), "invalid json: invalid hex digit in \\u escape at byte 5");
  EXPECT_EQ(json_error(R"("\u12")"), "invalid json: truncated \\u escape at byte 1");
  EXPECT_EQ(json_error(R"("\udc00")"), "invalid json: lone low surrogate in \\u escape at byte 1");
  EXPECT_EQ(json_error(R"("\ud800x")"),
            "invalid json: high surrogate not followed by a low surrogate escape at byte 1");
  EXPECT_EQ(json_error(R"("\ud800\u0041")"),
            "invalid json: high surrogate not followed by a low surrogate escape at byte 1");
  EXPECT_THAT(json_error("\"\xff\""), HasSubstr("invalid utf-8 lead byte 0xff"));
  EXPECT_THAT(json_error("\"\xc0\xaf\""), HasSubstr("invalid utf-8 lead byte 0xc0"));
  EXPECT_THAT(json_error("\"\xe0\x80\xaf\""), HasSubstr("overlong utf-8 sequence"));
  EXPECT_THAT(json_error("\"\xed\xa0\x80\""), HasSubstr("utf-8 encoded surrogate"));
  EXPECT_THAT(json_error("\"\xf4\x90\x80\x80\""), HasSubstr("above U+10FFFF"));
  EXPECT_THAT(json_error("\"\xe2\x82"), HasSubstr("truncated utf-8 sequence"));
}

TEST(JsonTest, Integers) {
  EXPECT_EQ(json::parse("0").as_int(), 0);
  EXPECT_EQ(json::parse("-0").as_int(), 0);
  EXPECT_EQ(json::parse("9223372036854775807").as_int(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(json::parse("-9223372036854775808").as_int(), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(json_error("9223372036854775808"),
            "invalid json: integer 9223372036854775808 out of the int64 range at byte 0");
  EXPECT_EQ(json_error("[-9223372036854775809]"),
            "invalid json: integer -9223372036854775809 out of the int64 range at byte 1");
  EXPECT_EQ(json_error("012"), "invalid json: invalid number: leading zero at byte 0");
  EXPECT_EQ(json_error("-"), "invalid json: invalid number: expected a digit at byte 1");
  EXPECT_EQ(json_error("1."), "invalid json: invalid number: expected a digit after '.' at byte 2");
  EXPECT_EQ(json_error("1e+"),
            "invalid json: invalid number: expected a digit in the exponent at byte 3");
  EXPECT_EQ(json_error("+1"),
            "invalid json: unexpected character '+', expected a json value at "
            "byte 0");
  EXPECT_EQ(json::parse("1.0").kind(), json::Kind::number);
  EXPECT_EQ(json::parse("1e0").kind(), json::Kind::number);
  EXPECT_DOUBLE_EQ(json::parse("-2.5E-1").as_double(), -0.25);
  EXPECT_EQ(json::parse("1e-400").as_double(), 0.0);
  EXPECT_EQ(json_error("1e400"), "invalid json: number 1e400 out of the double range at byte 0");
  EXPECT_THAT(json_error("-0.1e310"), HasSubstr("number -0.1e310 out of the double range"));
  EXPECT_THAT(json_error("12345.6e305"), HasSubstr("out of the double range"));
  EXPECT_DOUBLE_EQ(json::parse("0.001e310").as_double(), 1e307);
  EXPECT_EQ(json::parse("123e-400").as_double(), 0.0);
  EXPECT_TRUE(std::signbit(json::parse("-0.00012e-350").as_double()));
  EXPECT_EQ(json::parse("0.0e99999999999999999999").as_double(), 0.0);
}

TEST(JsonTest, StructureErrors) {
  EXPECT_EQ(json_error(""),
            "invalid json: unexpected end of input, expected a json value at "
            "byte 0");
  EXPECT_EQ(json_error("[1,]"),
            "invalid json: unexpected character ']', expected a json value "
            "at byte 3");
  EXPECT_EQ(json_error("[1 2]"),
            "invalid json: unexpected character '2', expected ',' or ']' at "
            "byte 3");
  EXPECT_EQ(json_error(R"({"a" 1})"),
            "invalid json: unexpected character '1', expected ':' at "
            "byte 5");
  EXPECT_EQ(json_error("{1:2}"),
            "invalid json: unexpected character '1', expected a string key "
            "at byte 1");
  EXPECT_EQ(json_error("tru"), "invalid json: invalid literal, expected 'true' at byte 0");
  EXPECT_EQ(json_error("nul"), "invalid json: invalid literal, expected 'null' at byte 0");
  EXPECT_EQ(json_error("{} {}"),
            "invalid json: unexpected character '{' after the json value at "
            "byte 3");
  EXPECT_EQ(json_error(R"({"k":1,"k":2})"), "invalid json: duplicate key \"k\" at byte 7");
  // Duplicates are per object: the same key in sibling objects is fine.
  EXPECT_NO_THROW(json::parse(R"({"a":{"k":1},"b":{"k":2}})"));
}

TEST(JsonTest, DepthLimit) {
  std::string ok = std::string(64, '[') + std::string(64, ']');
  EXPECT_NO_THROW(json::parse(ok));
  std::string deep = std::string(65, '[') + std::string(65, ']');
  EXPECT_EQ(json_error(deep), "invalid json: nesting deeper than 64 levels at byte 64");
  // Very deep input does not exhaust the stack.
  std::string very_deep(1'000'000, '[');
  EXPECT_THAT(json_error(very_deep), HasSubstr("nesting deeper than 64 levels"));
  EXPECT_NO_THROW(json::parse("[[[]]]", 3));
  EXPECT_THAT(error_of([] { json::parse("[[[]]]", 2); }), HasSubstr("nesting deeper than 2"));
}

TEST(JsonTest, QuoteAndDumpRoundTrip) {
  EXPECT_EQ(json::quote("a\"b\\\n\x01"), R"("a\"b\\\n\u0001")");
  std::string text = R"({"s":"q\"\u0001\u00e9","a":[1,-2,1.5,true,null],"o":{"x":{}}})";
  json::Value v = json::parse(text);
  std::string dumped = json::dump(v);
  EXPECT_EQ(dumped, "{\"s\":\"q\\\"\\u0001\xc3\xa9\",\"a\":[1,-2,1.5,true,null],\"o\":{\"x\":{}}}");
  EXPECT_EQ(json::dump(json::parse(dumped)), dumped);
  EXPECT_EQ(json::dump(json::Value::of_double(2.0)), "2.0");
  EXPECT_EQ(json::parse(json::dump(json::Value::of_double(2.0))).kind(), json::Kind::number);
}

TEST(JsonTest, ParseErrorCarriesOffset) {
  try {
    json::parse("[1, x]");
    FAIL() << "no exception";
  } catch (const json::ParseError& e) {
    EXPECT_EQ(e.offset(), 4u);
    EXPECT_EQ(e.detail(), "unexpected character 'x', expected a json value");
    EXPECT_THAT(e.what(), MatchesRegex("invalid json: .* at byte 4"));
  }
}

}  // namespace
}  // namespace kiln::rt
