// Weights mapped from their file (issue 28, point 4), on tests/abi/mapped.kir (32 MiB of f32
// weights: an embedding read as stored and two linear weights laid out for their kernel):
//  - laid-out weights (kiln_model_save_weights, `kiln pack-weights`) give the checkpoint's
//    outputs bit for bit, for the f32 (panel-packed) and int8 layouts;
//  - laid-out weights of another layout, truncated or with a bad header are refused, naming
//    the file and the problem;
//  - two processes holding one model share the weights' pages: with laid-out weights all of
//    them, with the safetensors checkpoint the weights read as stored (the embedding), each
//    process laying out its own linear weights (their panels). Each process's RSS and PSS
//    (smaps_rollup) and those of its mapping of the weights file (smaps) are printed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "mapped_f32.h"
#include "mapped_int8.h"
#include "runtime/safetensors.h"

namespace kiln {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kEmbedBytes = 4096 * 1024 * 4, kLinearBytes = 2 * 2048 * 1024 * 4;

fs::path folder(const std::string& name) {
  fs::path p = fs::path(::testing::TempDir()) / ("mapped_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A checkpoint of mapped.kir's weights, uniform in [-0.05, 0.05] (seeded).
std::string write_checkpoint(const fs::path& dir) {
  std::mt19937 rng(28);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  auto random = [&](std::string name, std::vector<int64_t> shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return rt::make_f32(std::move(name), std::move(shape), v);
  };
  const std::string path = (dir / "mapped.safetensors").string();
  rt::write_safetensors(path, {random("embed", {4096, 1024}), random("w1", {2048, 1024}),
                               random("b1", {2048}), random("w2", {1024, 2048})});
  return path;
}

// Both entry points' outputs, one after the other.
template <typename Model>
std::vector<float> outputs(Model& model) {
  std::vector<float> s(1024);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.001f * static_cast<float>(i);
  std::vector<float> out = model.column_sums(Tensor<float>{{1024}, s}).data;
  const std::vector<float> y = model.forward(Tensor<int64_t>{{5}, {7, 0, 4095, 1234, 7}}).data;
  out.insert(out.end(), y.begin(), y.end());
  return out;
}

template <typename Model>
void expect_bit_identical(const std::string& name) {
  const fs::path dir = folder(name);
  const std::string checkpoint = write_checkpoint(dir),
                    laid_out = (dir / "w.kiln-weights").string();
  Model from_checkpoint(checkpoint.c_str());
  from_checkpoint.save_weights(laid_out);
  Model from_laid_out(laid_out.c_str());
  const std::vector<float> want = outputs(from_checkpoint), got = outputs(from_laid_out);
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * 4), 0);
  EXPECT_NE(want[0], 0.0f);  // the outputs are the weights' (not a zero model's)
}

TEST(MappedWeights, LaidOutF32WeightsGiveTheCheckpointsOutputsBitForBit) {
  expect_bit_identical<kiln_models::mapped_f32>("f32");
}

TEST(MappedWeights, LaidOutInt8WeightsGiveTheCheckpointsOutputsBitForBit) {
  expect_bit_identical<kiln_models::mapped_int8>("int8");
}

std::string load_error(const std::string& weights) {
  try {
    kiln_models::mapped_f32 model(weights.c_str());
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(loaded)";
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(MappedWeights, StaleOrCorruptLaidOutWeightsAreRefused) {
  const fs::path dir = folder("refused");
  const std::string checkpoint = write_checkpoint(dir);
  const std::string f32 = (dir / "f32.kiln-weights").string(),
                    int8 = (dir / "int8.kiln-weights").string();
  kiln_models::mapped_f32(checkpoint.c_str()).save_weights(f32);
  kiln_models::mapped_int8(checkpoint.c_str()).save_weights(int8);
  // Another layout of the same model's weights (int8 instead of f32).
  EXPECT_THAT(load_error(int8),
              HasSubstr("laid-out weights '" + int8 +
                        "' were written for another model or weight layout (model 'mapped', 6 "
                        "weights, layout hash "));
  EXPECT_THAT(load_error(int8), HasSubstr("write them again with 'kiln pack-weights'"));
  const std::string whole = bytes_of(f32);
  auto write = [&](const std::string& name, const std::string& bytes) {
    const std::string p = (dir / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  };
  // Cut short (a copy that stopped): refused before any weight is read.
  const std::string cut = write("cut.kiln-weights", whole.substr(0, whole.size() - 4096));
  EXPECT_THAT(load_error(cut),
              HasSubstr(fmt::format("laid-out weights '{}' are {} bytes, their header says {} "
                                    "(truncated or changed)",
                                    cut, whole.size() - 4096, whole.size())));
  const std::string header = write("header.kiln-weights", whole.substr(0, 20));
  EXPECT_THAT(load_error(header),
              HasSubstr("laid-out weights '" + header +
                        "' are truncated (20 bytes, shorter than their header)"));
  std::string version = whole;
  version[8] = 9;
  EXPECT_THAT(load_error(write("version.kiln-weights", version)),
              HasSubstr("have format version 9, this runtime reads version 1"));
  // A weight's offset moved off its place (a corrupt table).
  std::string moved = whole;
  const size_t table = 48 + std::string("mapped").size();
  moved[table + 1] = static_cast<char>(moved[table + 1] + 1);  // weight 0's offset + 256
  EXPECT_THAT(load_error(write("moved.kiln-weights", moved)),
              HasSubstr("put weight 'embed' at bytes ["));
  // A checkpoint is still a checkpoint: a truncated safetensors file gets its own error.
  const std::string ck = bytes_of(checkpoint);
  EXPECT_THAT(load_error(write("cut.safetensors", ck.substr(0, ck.size() / 2))),
              HasSubstr("exceed data section of"));
}

// A running mapped_weights_holder: its pid, its standard input (closed: it exits) and output.
struct Holder {
  pid_t pid = -1;
  int in = -1, out = -1;
};

Holder start_holder(const std::string& weights) {
  int to[2], from[2];
  if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0)
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
  Holder h;
  h.pid = ::fork();
  if (h.pid == 0) {
    ::dup2(to[0], 0);
    ::dup2(from[1], 1);
    ::close(to[1]);
    ::close(from[0]);
    ::execl(KILN_MAPPED_HOLDER, KILN_MAPPED_HOLDER, weights.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(to[0]);
  ::close(from[1]);
  h.in = to[1];
  h.out = from[0];
  return h;
}

// Its first line of output ("ready ..."), waiting up to a minute.
std::string ready_line(const Holder& h) {
  std::string line;
  char c;
  while (line.empty() || line.back() != '\n') {
    pollfd p{h.out, POLLIN, 0};
    if (::poll(&p, 1, 60000) <= 0 || ::read(h.out, &c, 1) != 1) break;
    line += c;
  }
  return line;
}

int stop_holder(Holder& h) {
  ::close(h.in);
  ::close(h.out);
  int status = 0;
  ::waitpid(h.pid, &status, 0);
  return status;
}

// kB fields of smaps_rollup, or of the smaps entries that map `file`, summed.
std::map<std::string, int64_t> memory_of(pid_t pid, const std::string& file = "") {
  std::ifstream in(fmt::format("/proc/{}/{}", pid, file.empty() ? "smaps_rollup" : "smaps"));
  std::map<std::string, int64_t> kb;
  std::string line;
  bool inside = file.empty();
  const std::string target = file.empty() ? "" : fs::canonical(file).string();
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key, value;
    words >> key >> value;
    if (key.empty() || key.back() != ':') {  // a mapping's header: "addr perms off dev inode path"
      inside =
          file.empty() || line.size() >= target.size() &&
                              line.compare(line.size() - target.size(), target.size(), target) == 0;
      continue;
    }
    if (inside && !value.empty() && std::isdigit(static_cast<unsigned char>(value[0])))
      kb[key.substr(0, key.size() - 1)] += std::stoll(value);
  }
  return kb;
}

std::string mib(int64_t kb) { return fmt::format("{:.1f} MiB", static_cast<double>(kb) / 1024); }

struct Shared {
  std::map<std::string, int64_t> total[2], file[2];
};

// Two holders of `weights`, measured while both are alive.
Shared two_holders(const std::string& weights, const char* what) {
  Holder h[2] = {start_holder(weights), start_holder(weights)};
  std::string first[2];
  for (int i = 0; i < 2; ++i) first[i] = ready_line(h[i]);
  Shared s;
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(first[i], ::testing::StartsWith("ready ")) << "holder " << i << " of " << weights;
    s.total[i] = memory_of(h[i].pid);
    s.file[i] = memory_of(h[i].pid, weights);
  }
  EXPECT_EQ(first[0], first[1]);  // the same outputs
  for (int i = 0; i < 2; ++i) {
    std::printf(
        "[ mapped ] %s, process %d: Rss %s, Pss %s, Anonymous %s; its mapping of %s: Rss %s, "
        "Pss %s, Shared %s\n",
        what, i + 1, mib(s.total[i]["Rss"]).c_str(), mib(s.total[i]["Pss"]).c_str(),
        mib(s.total[i]["Anonymous"]).c_str(), fs::path(weights).filename().c_str(),
        mib(s.file[i]["Rss"]).c_str(), mib(s.file[i]["Pss"]).c_str(),
        mib(s.file[i]["Shared_Clean"] + s.file[i]["Shared_Dirty"]).c_str());
    EXPECT_EQ(stop_holder(h[i]), 0);
  }
  return s;
}

TEST(MappedWeights, TwoProcessesShareTheWeightsPages) {
  const fs::path dir = folder("shared");
  const std::string checkpoint = write_checkpoint(dir),
                    laid_out = (dir / "w.kiln-weights").string();
  kiln_models::mapped_f32(checkpoint.c_str()).save_weights(laid_out);
  // The plan holds 48 MiB of weights: each linear weight as stored (16 MiB, read by the
  // kernel for few rows) and laid out in panels (16 MiB), the embedding (16 MiB) and the bias.
  const int64_t checkpoint_kb = static_cast<int64_t>(fs::file_size(checkpoint)) / 1024;
  const int64_t weights_kb = static_cast<int64_t>(fs::file_size(laid_out)) / 1024 - 4;
  EXPECT_GT(weights_kb, (kEmbedBytes + 2 * kLinearBytes) / 1024);
  std::printf("[ mapped ] checkpoint %s, laid-out weights %s\n", mib(checkpoint_kb).c_str(),
              mib(weights_kb).c_str());
  auto shared = [](std::map<std::string, int64_t>& kb) {
    return kb["Shared_Clean"] + kb["Shared_Dirty"];  // dirty: the file was just written
  };

  // Laid-out weights: all of them mapped, none copied into a process's own memory; the
  // pages the runs read (the embedding and the panels, 32 MiB: the linear weights as stored
  // are not read for these rows, so never paged in) are each shared by both processes (each
  // process's PSS counts half of them).
  Shared s = two_holders(laid_out, "laid-out weights (kiln pack-weights)");
  const int64_t read_kb = (kEmbedBytes + kLinearBytes) / 1024;
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(s.file[i]["Rss"], read_kb * 99 / 100) << "process " << i + 1;
    EXPECT_GE(shared(s.file[i]), s.file[i]["Rss"] * 99 / 100) << "process " << i + 1;
    EXPECT_LE(s.file[i]["Pss"], s.file[i]["Rss"] / 2 + 64) << "process " << i + 1;
    EXPECT_GE(s.total[i]["Rss"] - s.total[i]["Pss"], read_kb * 49 / 100) << "process " << i + 1;
    EXPECT_LT(s.total[i]["Anonymous"], kLinearBytes / 1024 / 2) << "process " << i + 1;
  }

  // The checkpoint: the weights read as stored (32 MiB: the embedding, the bias, the linear
  // weights as stored) are bound to the file's shared pages; the linear weights' panels
  // (16 MiB) are laid out by each process into its own memory.
  s = two_holders(checkpoint, "safetensors checkpoint");
  for (int i = 0; i < 2; ++i) {
    EXPECT_GE(shared(s.file[i]), checkpoint_kb * 99 / 100) << "process " << i + 1;
    EXPECT_LE(s.file[i]["Pss"], s.file[i]["Rss"] / 2 + 64) << "process " << i + 1;
    EXPECT_GE(s.total[i]["Anonymous"], kLinearBytes / 1024) << "process " << i + 1;
  }
}

}  // namespace
}  // namespace kiln
