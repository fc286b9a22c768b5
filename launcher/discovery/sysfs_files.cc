#include "launcher/discovery/sysfs_files.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace railshard::launcher::discovery {

namespace fs = std::filesystem;

std::optional<std::string> readText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  // sysfs attributes whose show() fails (speed of a down link) open fine but fail the read.
  if (in.bad()) return std::nullopt;
  return text.str();
}

std::optional<std::string> readLine(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string line;
  if (!std::getline(in, line)) return std::nullopt;
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

std::optional<long long> readInteger(const std::string& path) {
  const auto line = readLine(path);
  if (!line || line->empty()) return std::nullopt;
  try {
    size_t used = 0;
    const long long value = std::stoll(*line, &used, 0);
    if (used == 0) return std::nullopt;
    return value;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

bool pathExists(const std::string& path) {
  std::error_code error;
  return fs::exists(path, error);
}

bool isDirectory(const std::string& path) {
  std::error_code error;
  return fs::is_directory(path, error);
}

std::vector<std::string> listDirectory(const std::string& path) {
  std::vector<std::string> names;
  std::error_code error;
  for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string resolvePath(const std::string& path) {
  std::error_code error;
  const fs::path resolved = fs::canonical(path, error);
  return error ? std::string() : resolved.string();
}

bool looksLikePciAddress(const std::string& text) {
  // DDDD:BB:DD.F, all hex except the separators.
  static constexpr const char* kShape = "xxxx:xx:xx.x";
  if (text.size() != 12) return false;
  for (size_t i = 0; i < text.size(); ++i) {
    if (kShape[i] == 'x') {
      if (!std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
    } else if (text[i] != kShape[i]) {
      return false;
    }
  }
  return true;
}

std::string nearestPciAddress(const std::string& resolved_path) {
  std::string found;
  for (const auto& part : fs::path(resolved_path)) {
    if (looksLikePciAddress(part.string())) found = part.string();
  }
  return found;
}

std::set<int> parseCpuList(const std::string& text) {
  std::set<int> cpus;
  std::stringstream in(text);
  std::string range;
  while (std::getline(in, range, ',')) {
    while (!range.empty() && std::isspace(static_cast<unsigned char>(range.back()))) {
      range.pop_back();
    }
    if (range.empty()) continue;
    try {
      const size_t dash = range.find('-');
      const int first = std::stoi(range.substr(0, dash));
      const int last = dash == std::string::npos ? first : std::stoi(range.substr(dash + 1));
      for (int cpu = first; cpu <= last; ++cpu) cpus.insert(cpu);
    } catch (const std::exception&) {
      // A malformed piece adds nothing; the rest of the list still counts.
    }
  }
  return cpus;
}

std::string formatCpuList(const std::set<int>& cpus) {
  std::string text;
  for (auto it = cpus.begin(); it != cpus.end();) {
    const int first = *it;
    int last = first;
    for (++it; it != cpus.end() && *it == last + 1; ++it) last = *it;
    if (!text.empty()) text += ',';
    text += std::to_string(first);
    if (last != first) text += '-' + std::to_string(last);
  }
  return text;
}

}  // namespace railshard::launcher::discovery
