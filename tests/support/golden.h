#pragma once
// What every golden-file test shares: whether this run rewrites the files
// (GEO_UPDATE_GOLDEN=1) instead of comparing with them, the command a
// failure tells the reader to run, and a file's whole text. Header only:
// the golden tests live in several test targets that share no library.

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace geo::golden {

inline constexpr const char* kRegenerate = "GEO_UPDATE_GOLDEN=1 ctest --test-dir build -R Golden";

inline bool updating() {
  const char* v = std::getenv("GEO_UPDATE_GOLDEN");
  return v != nullptr && std::string(v) == "1";
}

// The file's bytes; empty when it cannot be read (the comparison then fails
// naming the file).
inline std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace geo::golden
