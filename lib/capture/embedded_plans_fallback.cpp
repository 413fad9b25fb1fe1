// TEMPORARY (until CMake generates the embedded plans with cmake/embed_plans.cmake): reads
// plans/<preset>.yaml from the source tree this file was compiled from. The integrator deletes
// this file when the generated source is wired in (it defines the same two functions).
#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "capture/embedded_plans.hpp"

namespace dynemb {

namespace {
std::string plans_dir() {
  std::string f = __FILE__;  // <src>/lib/capture/embedded_plans_fallback.cpp
  for (int i = 0; i < 3; ++i) f = f.substr(0, f.find_last_of('/'));
  return f + "/plans";
}
}  // namespace

const char* embedded_plan_text(const std::string& preset) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(preset);
  if (it != cache.end()) return it->second.c_str();
  if (preset.empty() || preset.find('/') != std::string::npos) return nullptr;
  std::ifstream in(plans_dir() + "/" + preset + ".yaml");
  if (!in) return nullptr;
  std::ostringstream ss;
  ss << in.rdbuf();
  return cache.emplace(preset, ss.str()).first->second.c_str();
}

std::vector<std::string> embedded_plan_names() {
  std::vector<std::string> names;
  if (DIR* d = opendir(plans_dir().c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.size() > 5 && n.compare(n.size() - 5, 5, ".yaml") == 0)
        names.push_back(n.substr(0, n.size() - 5));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace dynemb
