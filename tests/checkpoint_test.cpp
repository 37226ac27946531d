// Checkpoints as they are published (issue 28), loaded by a compiled model (golden_tiny): F16
// safetensors (each value widened exactly: the same logits as the f32 checkpoint of the
// rounded values), and sharded checkpoints (model.safetensors.index.json and its shards: the
// same logits as the one file), with every malformed index refused, naming the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "golden_tiny.h"
#include "runtime/safetensors.h"
#include "runtime/weights.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string golden(const std::string& f) {
  return std::string(KILN_TEST_DATA_DIR) + "/golden/" + f;
}

// A fresh folder for one test's files.
fs::path folder(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("checkpoint_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::vector<rt::TensorData> tiny_tensors() {
  rt::SafeTensors file = rt::SafeTensors::load(golden("tiny.weights.safetensors"));
  std::vector<rt::TensorData> out;
  for (const rt::TensorInfo& t : file.tensors()) {
    std::span<const uint8_t> b = file.bytes(t);
    out.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(b.begin(), b.end())});
  }
  return out;
}

Tensor<float> tiny_logits(const std::string& weights) {
  kiln_models::golden_tiny model(weights.c_str());
  const std::string in = golden("tiny_b1.inputs.safetensors");
  return model.forward(read_tensor<int64_t>(in, "src"), read_tensor<int64_t>(in, "tgt"));
}

TEST(Checkpoints, F16ToF32IsExact) {
  EXPECT_EQ(rt::f16_to_f32(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(rt::f16_to_f32(0x8000)));
  EXPECT_EQ(rt::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(rt::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(rt::f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(rt::f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));
  EXPECT_EQ(rt::f16_to_f32(0x7BFF), 65504.0f);  // the largest finite
  EXPECT_EQ(rt::f16_to_f32(0x7C00), INFINITY);
  EXPECT_TRUE(std::isnan(rt::f16_to_f32(0x7E00)));
  // Every finite half against the compiler's own conversion.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    _Float16 h;
    const uint16_t bits = static_cast<uint16_t>(b);
    std::memcpy(&h, &bits, 2);
    const float want = static_cast<float>(h);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(rt::f16_to_f32(bits))) << b;
    else
      ASSERT_EQ(rt::f16_to_f32(bits), want) << b;
  }
}

// The tiny checkpoint's tensors in F16 (rounded to nearest), and in f32 holding the same
// rounded values.
std::pair<std::vector<rt::TensorData>, std::vector<rt::TensorData>> tiny_half_and_rounded() {
  std::vector<rt::TensorData> half, rounded;
  for (const rt::TensorData& t : tiny_tensors()) {
    EXPECT_EQ(t.dtype, rt::DType::f32);
    rt::TensorData h{t.name, rt::DType::f16, t.shape, {}}, r{t.name, rt::DType::f32, t.shape, {}};
    for (size_t i = 0; i + 4 <= t.data.size(); i += 4) {
      float x;
      std::memcpy(&x, t.data.data() + i, 4);
      const _Float16 v = static_cast<_Float16>(x);
      uint16_t bits;
      std::memcpy(&bits, &v, 2);
      h.data.push_back(static_cast<uint8_t>(bits & 0xFF));
      h.data.push_back(static_cast<uint8_t>(bits >> 8));
      const float back = static_cast<float>(v);
      const auto* p = reinterpret_cast<const uint8_t*>(&back);
      r.data.insert(r.data.end(), p, p + 4);
    }
    half.push_back(std::move(h));
    rounded.push_back(std::move(r));
  }
  return {half, rounded};
}

TEST(Checkpoints, F16WeightsGiveTheLogitsOfTheirF32Values) {
  const fs::path dir = folder("f16");
  const auto [half, rounded] = tiny_half_and_rounded();
  rt::write_safetensors((dir / "half.safetensors").string(), half);
  rt::write_safetensors((dir / "rounded.safetensors").string(), rounded);
  const Tensor<float> from_half = tiny_logits((dir / "half.safetensors").string());
  EXPECT_EQ(from_half.data, tiny_logits((dir / "rounded.safetensors").string()).data);
  // And near PyTorch's f32 logits (the weights rounded to 11 significant bits).
  const Tensor<float> want = read_tensor<float>(golden("tiny_b1.expected.safetensors"), "logits");
  double err = 0;
  for (size_t i = 0; i < want.data.size(); ++i)
    err = std::max(err, std::abs(static_cast<double>(from_half.data[i]) - want.data[i]));
  EXPECT_LT(err, 0.05);
  std::printf("[ f16 ] tiny_b1 logits from F16 weights vs PyTorch f32: max abs error %.3g\n", err);
}

// Writes `all` as `shards` shards and an index (the tensors dealt round-robin).
void write_sharded(const fs::path& dir, const std::vector<rt::TensorData>& all, int shards) {
  std::vector<std::vector<rt::TensorData>> parts(static_cast<size_t>(shards));
  std::string map;
  auto shard_name = [&](size_t s) {
    return "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) +
           ".safetensors";
  };
  for (size_t i = 0; i < all.size(); ++i) {
    const size_t s = i % static_cast<size_t>(shards);
    parts[s].push_back(all[i]);
    map += (map.empty() ? "" : ", ") + ("\"" + all[i].name + "\": \"" + shard_name(s) + "\"");
  }
  for (size_t s = 0; s < parts.size(); ++s)
    rt::write_safetensors((dir / shard_name(s)).string(), parts[s]);
  std::ofstream(dir / "model.safetensors.index.json")
      << "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {" << map << "}}\n";
}
void write_sharded(const fs::path& dir, int shards) { write_sharded(dir, tiny_tensors(), shards); }

TEST(Checkpoints, ShardedCheckpointsGiveTheLogitsOfOneFile) {
  const fs::path dir = folder("sharded");
  write_sharded(dir, 3);
  const Tensor<float> one = tiny_logits(golden("tiny.weights.safetensors"));
  EXPECT_EQ(tiny_logits((dir / "model.safetensors.index.json").string()).data, one.data);
  EXPECT_EQ(tiny_logits(dir.string()).data, one.data);  // the folder
  // A folder with one .safetensors file is that file.
  const fs::path single = folder("single");
  fs::copy_file(golden("tiny.weights.safetensors"), single / "weights.safetensors");
  EXPECT_EQ(tiny_logits(single.string()).data, one.data);
}

// Checkpoints as they are published for large models: sharded, in F16.
TEST(Checkpoints, AnF16ShardedCheckpointGivesTheLogitsOfItsF32Values) {
  const fs::path dir = folder("f16_sharded");
  const auto [half, rounded] = tiny_half_and_rounded();
  write_sharded(dir, half, 2);
  rt::write_safetensors((dir.parent_path() / "checkpoint_rounded.safetensors").string(), rounded);
  EXPECT_EQ(tiny_logits(dir.string()).data,
            tiny_logits((dir.parent_path() / "checkpoint_rounded.safetensors").string()).data);
}

// The message model creation fails with for the index `json` (beside the shards of
// write_sharded(dir, 2)), after `mutate` changed the folder.
std::string error_for(const std::string& name, const std::string& json,
                      void (*mutate)(const fs::path&) = nullptr) {
  const fs::path dir = folder(name);
  write_sharded(dir, 2);
  if (!json.empty()) std::ofstream(dir / "model.safetensors.index.json") << json;
  if (mutate) mutate(dir);
  try {
    kiln_models::golden_tiny model((dir / "model.safetensors.index.json").string().c_str());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Checkpoints, MalformedIndexesAreRefusedNamingTheProblem) {
  EXPECT_THAT(error_for("notjson", "{\"weight_map\": "), HasSubstr("is not valid JSON"));
  EXPECT_THAT(error_for("nomap", "{\"metadata\": {}}"), HasSubstr("has no \"weight_map\" object"));
  EXPECT_THAT(error_for("notname", "{\"weight_map\": {\"generator.bias\": 3}}"),
              HasSubstr("the shard of tensor 'generator.bias' is not a file name"));
  EXPECT_THAT(error_for("escape", "{\"weight_map\": {\"generator.bias\": \"../x.safetensors\"}}"),
              HasSubstr("is not a plain file name beside the index"));
  EXPECT_THAT(error_for("absent", "{\"weight_map\": {\"generator.bias\": \"nope.safetensors\"}}"),
              HasSubstr("nope.safetensors"));
  EXPECT_THAT(error_for("lacks",
                        "{\"weight_map\": {\"not.there\": "
                        "\"model-00001-of-00002.safetensors\"}}"),
              HasSubstr("puts tensor 'not.there' in shard"));
  // The index names one shard only: the tensors of that shard it does not name are refused.
  EXPECT_THAT(error_for("unnamed",
                        "{\"weight_map\": {\"generator.bias\": "
                        "\"model-00001-of-00002.safetensors\"}}"),
              ::testing::AnyOf(HasSubstr("which checkpoint index"), HasSubstr("does not have it")));
  // A tensor in both shards.
  EXPECT_THAT(
      error_for("twice", "",
                [](const fs::path& dir) {
                  std::vector<rt::TensorData> both;
                  for (const std::string f :
                       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
                    rt::SafeTensors s = rt::SafeTensors::load((dir / f).string());
                    for (const rt::TensorInfo& t : s.tensors()) {
                      std::span<const uint8_t> b = s.bytes(t);
                      both.push_back({t.name, t.dtype, t.shape, {b.begin(), b.end()}});
                    }
                  }
                  rt::write_safetensors((dir / "model-00002-of-00002.safetensors").string(), both);
                }),
      HasSubstr("and in shard"));
  // A missing tensor is the model's usual problem list, naming the tensor.
  EXPECT_THAT(error_for("missing", "",
                        [](const fs::path& dir) {
                          std::vector<rt::TensorData> kept;
                          for (rt::TensorData& t : tiny_tensors())
                            if (t.name != "generator.bias") kept.push_back(std::move(t));
                          write_sharded(dir, kept, 2);
                        }),
              HasSubstr("missing tensor 'generator.bias'"));
}

}  // namespace
}  // namespace kiln
