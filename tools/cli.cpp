// What kiln and kiln-run share (see cli.h).
#include "tools/cli.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>

#include <fmt/format.h>

#include "runtime/weights.h"
#include "support/file_io.h"
#include "support/read_file.h"

namespace kiln::tools {

Args Args::parse(const std::vector<std::string>& argv, const std::set<std::string>& with_value,
                 const std::set<std::string>& flag_names, const std::string& command) {
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& s = argv[i];
    if (s.size() > 1 && s[0] == '-' && s != "-") {
      std::string name = s, value;
      bool has_value = false;
      if (size_t eq = s.find('='); eq != std::string::npos) {
        name = s.substr(0, eq);
        value = s.substr(eq + 1);
        has_value = true;
      }
      if (flag_names.count(name)) {
        if (has_value) fail("{}: option '{}' takes no value", command, name);
        a.flags.insert(name);
      } else if (with_value.count(name)) {
        if (!has_value) {
          if (i + 1 >= argv.size()) fail("{}: option '{}' needs a value", command, name);
          value = argv[++i];
        }
        a.options[name].push_back(value);
      } else {
        fail("{}: unknown option '{}' (see 'kiln {} --help')", command, name, command);
      }
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

std::optional<std::string> Args::get(const std::string& name) const {
  auto it = options.find(name);
  if (it == options.end()) return std::nullopt;
  return it->second.back();
}

std::string Args::require(const std::string& name, const std::string& command) const {
  auto v = get(name);
  if (!v) fail("{}: missing required option '{}' (see 'kiln {} --help')", command, name, command);
  return *v;
}

bool wants_help(const std::vector<std::string>& argv) {
  for (const auto& a : argv)
    if (a == "--help" || a == "-h") return true;
  return false;
}

void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-")
    write_stdout(text);
  else
    write_file_atomically(path, text);
}

void print_error(const Error& e) {
  std::fflush(stdout);
  fmt::print(stderr, "kiln: error: {}\n", e.what());
}

std::vector<uint8_t> read_bytes(const std::string& path) { return read_input_file(path); }

std::string read_text(const std::string& path) {
  std::vector<uint8_t> b = read_bytes(path);
  return std::string(b.begin(), b.end());
}

rt::SafeTensors load_safetensors(const std::string& path) {
  if (path == "-") return rt::SafeTensors::from_bytes(read_bytes(path), "<stdin>");
  return rt::SafeTensors::load(path);
}

int report_outputs(const Args& a, const std::vector<rt::TensorData>& data) {
  // Outputs as f32 for summaries and comparisons (integer outputs are summarized by shape).
  auto floats = [](const rt::TensorData& t) {
    std::vector<float> v(t.data.size() / 4);
    std::memcpy(v.data(), t.data.data(), v.size() * 4);
    return v;
  };

  if (auto out = a.get("-o")) {
    rt::write_safetensors(*out, data);
    fmt::print(stderr, "wrote {} output(s) to {}\n", data.size(), *out);
  } else if (!a.get("--expect")) {
    for (const rt::TensorData& t : data) {
      if (t.dtype != rt::DType::f32) {
        fmt::print("{}: {} {}\n", t.name, rt::dtype_name(t.dtype), rt::shape_string(t.shape));
        continue;
      }
      std::vector<float> v = floats(t);
      double lo = INFINITY, hi = -INFINITY, sum = 0;
      for (float x : v) lo = std::min<double>(lo, x), hi = std::max<double>(hi, x), sum += x;
      fmt::print("{}: f32{} min {:.6g} max {:.6g} mean {:.6g}\n", t.name, rt::shape_string(t.shape),
                 lo, hi, v.empty() ? 0.0 : sum / v.size());
    }
  }
  if (auto expect_path = a.get("--expect")) {
    double atol = 1e-4;
    if (auto s = a.get("--atol")) {
      try {
        atol = std::stod(*s);
      } catch (...) {
        fail("run: --atol needs a number, got '{}'", *s);
      }
    }
    rt::SafeTensors expected = load_safetensors(*expect_path);
    bool ok = true;
    for (const rt::TensorData& t : data) {
      const rt::TensorInfo& e = expected.at(t.name);
      if (e.shape != t.shape)
        fail("run: output '{}' has shape {}, expected {}", t.name, rt::shape_string(t.shape),
             rt::shape_string(e.shape));
      if (t.dtype != rt::DType::f32) {
        // Ids and masks: exact. The expected tensor may be I64 or I32 for ids.
        std::vector<int64_t> got(t.data.size() / rt::dtype_size(t.dtype));
        for (size_t j = 0; j < got.size(); ++j)
          got[j] = t.dtype == rt::DType::i64 ? reinterpret_cast<const int64_t*>(t.data.data())[j]
                                             : t.data[j];
        std::vector<int64_t> want;
        if (e.dtype == rt::DType::boolean || e.dtype == rt::DType::u8) {
          std::span<const uint8_t> b = expected.bytes(e);
          want.assign(b.begin(), b.end());
        } else {
          want = expected.to_i64(e);
        }
        int64_t differ = 0;
        for (size_t j = 0; j < got.size(); ++j) differ += got[j] != want[j];
        ok &= differ == 0;
        fmt::print("{}: {} of {} elements differ vs {} ({})\n", t.name, differ, got.size(),
                   *expect_path, differ == 0 ? "match" : "MISMATCH");
        continue;
      }
      // NaN or an infinity matches only the same value in the expected tensor.
      std::vector<float> want = expected.to_f32(e), got = floats(t);
      double err = 0;
      int64_t non_finite = 0;
      for (size_t j = 0; j < want.size() && j < got.size(); ++j) {
        if (!std::isfinite(got[j]) || !std::isfinite(want[j])) {
          const bool same = (std::isnan(got[j]) && std::isnan(want[j])) || got[j] == want[j];
          non_finite += !same;
          continue;
        }
        err = std::max(err, std::abs(static_cast<double>(got[j]) - want[j]));
      }
      bool pass = err <= atol && non_finite == 0;
      ok &= pass;
      if (non_finite)
        fmt::print("{}: {} NaN or infinite element(s) where {} has another value (MISMATCH)\n",
                   t.name, non_finite, *expect_path);
      fmt::print("{}: max abs error {:.3g} vs {} ({} <= {:g})\n", t.name, err, *expect_path,
                 pass ? "match" : "MISMATCH", atol);
    }
    return ok ? 0 : 1;
  }
  return 0;
}

int run_main(int argc, char** argv, int (*dispatch)(const std::vector<std::string>&)) {
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    const int status = dispatch(args);
    write_stdout("");  // what was printed reached its destination, or exit 1
    return status;
  } catch (const Error& e) {
    print_error(e);
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "kiln: internal error: {}\n", e.what());
    return 70;
  }
}

}  // namespace kiln::tools
