// Finding the processes a test started, at any depth: each inherits an environment entry
// the test chose (a marker), so /proc tells them apart from everything else on the machine.
// For the tests that kill or interrupt kiln and check that nothing it started lives on.
#pragma once

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace kiln::testing {

// The live (not zombie) processes whose environment holds `marker`.
inline std::vector<pid_t> marked_processes(const std::string& marker) {
  auto read_all = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    const std::string stat = read_all(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') continue;
    if (read_all(entry.path() / "environ").find(marker) != std::string::npos)
      out.push_back(std::stoi(name));
  }
  return out;
}

// Waits up to `seconds` for every marked process to end, reaping orphans on the way (the
// caller is a subreaper, PR_SET_CHILD_SUBREAPER); returns those still alive.
inline std::vector<pid_t> wait_for_marked(const std::string& marker, double seconds) {
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::vector<pid_t> left = marked_processes(marker);
  while (!left.empty() && elapsed() < seconds) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    ::usleep(20000);
    left = marked_processes(marker);
  }
  return left;
}

}  // namespace kiln::testing
