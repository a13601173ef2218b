// Golden files: every object the controller renders for every region of the
// samples in manifests/samples/, compared with golden/<sample>/<region>.yaml
// (multi-document YAML, reviewed by eye once; see golden/README.md).
//
// The inputs are fixed, so the output is too: the job's uid and namespace,
// one CURVE keypair per rank from a fixed seed (crypto_box_seed_keypair), the
// gateway endpoints as gatewayEndpoint() derives them from a fixed
// load-balancer address, and the default RenderSettings with a fixed image.
//
// After an intended change to what the controller renders, regenerate the
// files, read their diff (git diff tests/controller/reconcile/golden) and
// commit them with the change:
//
//   GEO_UPDATE_GOLDEN=1 ctest --test-dir build -R Golden
//   (or: GEO_UPDATE_GOLDEN=1 build/tests/controller/reconcile/render_test
//        --gtest_filter='*Golden*')
//
// A new kind of object belongs in renderRegion() below.

#include <gtest/gtest.h>
#include <sodium.h>
#include <yaml-cpp/yaml.h>
#include <zmq.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "controller/reconcile/render.h"
#include "tests/support/golden.h"
#include "tests/support/yaml_json.h"

namespace geo::reconcile {
namespace {

using golden::kRegenerate;
using golden::readFile;
using golden::updating;

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kNamespace = "default";
constexpr const char* kUid = "00000000-0000-4000-8000-000000000001";
constexpr const char* kImage = "ghcr.io/geotrain/worker:golden";

// YAML -> JSON as Kubernetes reads manifests (tests/support/yaml_json.h).
json yamlToJson(const YAML::Node& node) {
  return testapi::yamlNodeToJson(node);
}

// ---- JSON -> block YAML (kubectl-like; strings that could read as anything
// else are double-quoted, multi-line strings are literal blocks) -----------

bool plainSafe(const std::string& s) {
  if (s.empty()) return false;
  const auto isAlnum = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0; };
  if (!isAlnum(s[0]) && s[0] != '/' && s[0] != '$' && s[0] != '_') return false;
  if (s.back() == ' ' || s.back() == ':') return false;
  if (s.find(": ") != std::string::npos) return false;
  for (char c : s) {
    if (!isAlnum(c) && std::string_view("._/-:$()=+@* ").find(c) == std::string_view::npos) {
      return false;
    }
  }
  // YAML 1.1 readers (still common) also take these for booleans, and
  // digits with separators for numbers, times or dates.
  std::string lower = s;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  static const std::set<std::string> kWords = {"y",   "n",    "yes",   "no",   "on",
                                               "off", "true", "false", "null", "~"};
  if (kWords.count(lower)) return false;
  if (std::isdigit(static_cast<unsigned char>(s[0])) &&
      s.find_first_not_of("0123456789_:.+-eExXoObB") == std::string::npos) {
    return false;
  }
  return yamlToJson(YAML::Node(s)) == json(s);
}

// A literal block keeps a multi-line string readable; it cannot start with a
// space (that needs an indentation indicator) or hold control characters.
bool literalSafe(const std::string& s) {
  if (s.find('\n') == std::string::npos || s[0] == ' ' || s[0] == '\n') return false;
  return std::none_of(s.begin(), s.end(), [](char c) {
    return (static_cast<unsigned char>(c) < 0x20 && c != '\n') || c == 0x7f;
  });
}

std::string scalar(const json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    return plainSafe(s) ? s : v.dump();  // a JSON string is a YAML double-quoted one
  }
  if (v.is_object()) return "{}";
  if (v.is_array()) return "[]";
  return v.dump();
}

bool inlineValue(const json& v) {
  if (v.is_object() || v.is_array()) return v.empty();
  return !(v.is_string() && literalSafe(v.get<std::string>()));
}

void emitBlock(const json& v, int indent, std::string& out);

// `v` after "key:" or "-": on the same line, or as a block below.
void emitValue(const json& v, int indent, std::string& out) {
  if (inlineValue(v)) {
    out += " " + scalar(v) + "\n";
    return;
  }
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    size_t trailing = 0;
    while (trailing < s.size() && s[s.size() - 1 - trailing] == '\n') ++trailing;
    out += trailing == 0 ? " |-\n" : trailing == 1 ? " |\n" : " |+\n";
    std::istringstream lines(s.substr(0, s.size() - trailing));
    for (std::string line; std::getline(lines, line);) {
      out += line.empty() ? "\n" : std::string(static_cast<size_t>(indent), ' ') + line + "\n";
    }
    for (size_t i = 1; i < trailing; ++i) out += "\n";
    return;
  }
  out += "\n";
  emitBlock(v, indent, out);
}

void emitBlock(const json& v, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  if (v.is_object()) {
    for (const auto& [key, value] : v.items()) {
      out += pad + scalar(json(key)) + ":";
      emitValue(value, indent + 2, out);
    }
    return;
  }
  for (const json& item : v) {
    if (!inlineValue(item) && !item.is_string()) {
      // "- " then the item's first line, its other lines below at indent + 2.
      std::string nested;
      emitBlock(item, indent + 2, nested);
      out += pad + "- " + nested.substr(static_cast<size_t>(indent) + 2);
    } else {
      out += pad + "-";
      emitValue(item, indent + 2, out);
    }
  }
}

std::string toYamlDocuments(const std::string& header, const std::vector<json>& objects) {
  std::string out = header;
  for (const json& o : objects) {
    out += "---\n";
    emitBlock(o, 0, out);
  }
  return out;
}

// ---- fixed inputs ---------------------------------------------------------

struct Sample {
  std::string name;  // file stem
  json object;
  api::TrainingJobSpec spec;
  JobRef job;
};

std::vector<std::string> sampleNames() {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(GEO_SAMPLES_DIR)) {
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

Sample loadSample(const std::string& name) {
  Sample s;
  s.name = name;
  s.object = yamlToJson(YAML::LoadFile(fs::path(GEO_SAMPLES_DIR) / (name + ".yaml")));
  // As the API server stores it: in a namespace, with a uid.
  s.object["metadata"]["namespace"] = kNamespace;
  s.object["metadata"]["uid"] = kUid;
  s.job = jobRefOf(s.object);
  const api::ParsedSpec parsed = api::parseSpec(s.object);
  EXPECT_TRUE(parsed.errors.empty()) << name << ": " << api::joinErrors(parsed.errors);
  s.spec = parsed.spec;
  const Status names = checkNames(s.job, s.spec);
  EXPECT_TRUE(names.ok()) << name << ": " << names.message();
  return s;
}

std::string z85(const unsigned char* key) {
  std::array<char, 41> text{};
  EXPECT_NE(zmq_z85_encode(text.data(), key, 32), nullptr);
  return std::string(text.data(), 40);
}

// Rank r's keypair from the seed 32 x (r + 1): the same on every run.
std::vector<RankKeys> fixedKeys(int64_t ranks) {
  EXPECT_GE(sodium_init(), 0);
  std::vector<RankKeys> keys;
  for (int64_t r = 0; r < ranks; ++r) {
    std::array<unsigned char, crypto_box_SEEDBYTES> seed{};
    seed.fill(static_cast<unsigned char>(r + 1));
    std::array<unsigned char, crypto_box_PUBLICKEYBYTES> pk{};
    std::array<unsigned char, crypto_box_SECRETKEYBYTES> sk{};
    EXPECT_EQ(crypto_box_seed_keypair(pk.data(), sk.data(), seed.data()), 0);
    keys.push_back({z85(pk.data()), z85(sk.data()), "", "", ""});
  }
  return keys;
}

// Every region's gateway endpoint as the reconciler finds it: the override,
// the cluster DNS name, or a load balancer with the address 203.0.113.<10+i>.
std::map<std::string, std::string> fixedEndpoints(const Sample& s, const RenderSettings& settings) {
  std::map<std::string, std::string> endpoints;
  for (size_t i = 0; i < s.spec.regions.size(); ++i) {
    json service = renderGatewayService(s.job, s.spec, i);
    service["status"]["loadBalancer"]["ingress"] = {
        {{"ip", "203.0.113." + std::to_string(10 + i)}}};
    endpoints[s.spec.regions[i].name] =
        gatewayEndpoint(s.job, s.spec.regions[i], service, settings);
  }
  return endpoints;
}

RenderSettings fixedSettings() {
  RenderSettings settings;
  settings.workerImage = kImage;
  return settings;
}

// The objects of region `index`, in the order the reconciler applies them.
std::vector<json> renderRegion(const Sample& s, size_t index) {
  const RenderSettings settings = fixedSettings();
  const auto keys = fixedKeys(s.spec.totalReplicas());
  const auto endpoints = fixedEndpoints(s, settings);
  auto configMap = renderConfigMap(s.job, s.spec, index, endpoints, keys, settings);
  EXPECT_TRUE(configMap.ok()) << configMap.status().toString();
  std::vector<json> objects = {renderHeadlessService(s.job, s.spec, index, settings),
                               renderGatewayService(s.job, s.spec, index),
                               renderKeysSecret(s.job, s.spec, index, keys)};
  if (s.spec.checkpointVolume) objects.push_back(renderCheckpointClaim(s.job, s.spec, index));
  objects.push_back(configMap.ok() ? *configMap : json());
  objects.push_back(renderWorkerJob(s.job, s.spec, index, settings));
  return objects;
}

fs::path goldenPath(const std::string& sample, const std::string& region) {
  return fs::path(GEO_GOLDEN_DIR) / sample / (region + ".yaml");
}

// ---- comparing ------------------------------------------------------------

std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A unified diff (3 lines of context) of `want` (golden) and `got`
// (rendered), cut after `maxLines` lines.
std::string unifiedDiff(const std::string& want, const std::string& got, size_t maxLines = 150) {
  const auto a = splitLines(want);
  const auto b = splitLines(got);
  const size_t n = a.size();
  const size_t m = b.size();
  // lcs[i][j]: length of the longest common subsequence of a[i:] and b[j:].
  std::vector<std::vector<uint32_t>> lcs(n + 1, std::vector<uint32_t>(m + 1, 0));
  for (size_t i = n; i-- > 0;) {
    for (size_t j = m; j-- > 0;) {
      lcs[i][j] = a[i] == b[j] ? lcs[i + 1][j + 1] + 1 : std::max(lcs[i + 1][j], lcs[i][j + 1]);
    }
  }
  struct Op {
    char kind;  // ' ', '-', '+'
    size_t ai, bi;
  };
  std::vector<Op> ops;
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i] == b[j]) {
      ops.push_back({' ', i++, j++});
    } else if (i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1])) {
      ops.push_back({'-', i++, j});
    } else {
      ops.push_back({'+', i, j++});
    }
  }
  constexpr size_t kContext = 3;
  std::string out;
  size_t lines = 0;
  for (size_t k = 0; k < ops.size();) {
    if (ops[k].kind == ' ') {
      ++k;
      continue;
    }
    // A hunk: kContext lines around each change, changes at most
    // 2 * kContext unchanged lines apart in one hunk.
    const size_t start = k >= kContext ? k - kContext : 0;
    size_t last = k;
    for (size_t h = k + 1; h < ops.size(); ++h) {
      if (ops[h].kind == ' ') continue;
      if (h - last - 1 > 2 * kContext) break;
      last = h;
    }
    const size_t end = std::min(ops.size(), last + 1 + kContext);
    out += "@@ golden line " + std::to_string(ops[start].ai + 1) + ", rendered line " +
           std::to_string(ops[start].bi + 1) + " @@\n";
    for (size_t h = start; h < end; ++h) {
      const Op& op = ops[h];
      out += std::string(1, op.kind) + (op.kind == '+' ? b[op.bi] : a[op.ai]) + "\n";
      if (++lines >= maxLines) return out + "... (diff cut)\n";
    }
    k = end;
  }
  return out;
}

class RenderGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(RenderGolden, EveryRegionMatchesItsFile) {
  const Sample s = loadSample(GetParam());
  ASSERT_FALSE(s.spec.regions.empty());
  for (size_t i = 0; i < s.spec.regions.size(); ++i) {
    const std::string& region = s.spec.regions[i].name;
    SCOPED_TRACE("sample " + s.name + ", region " + region);
    const std::vector<json> objects = renderRegion(s, i);
    const std::string header =
        "# The objects the controller renders for region " + region + " of manifests/samples/" +
        s.name + ".yaml\n# (namespace " + kNamespace + ", uid " + kUid +
        ", fixed keys and gateway addresses).\n"
        "# Generated by tests/controller/reconcile/render_golden_test.cc: do not edit, run\n#   " +
        kRegenerate + "\n";
    const std::string text = toYamlDocuments(header, objects);

    // The YAML says exactly what the objects say.
    std::vector<json> reread;
    for (const YAML::Node& doc : YAML::LoadAll(text)) reread.push_back(yamlToJson(doc));
    ASSERT_EQ(reread.size(), objects.size());
    for (size_t k = 0; k < objects.size(); ++k) {
      EXPECT_EQ(reread[k], objects[k]) << "the golden YAML does not read back as the object\n"
                                       << objects[k].dump(2);
    }

    const fs::path path = goldenPath(s.name, region);
    if (updating()) {
      fs::create_directories(path.parent_path());
      std::ofstream out(path, std::ios::binary);
      out << text;
      out.close();
      ASSERT_TRUE(out) << "cannot write " << path.string();
      std::cout << "wrote " << path.string() << "\n";
      continue;
    }
    ASSERT_TRUE(fs::exists(path)) << path.string() << " is missing; create it with\n  "
                                  << kRegenerate;
    const std::string want = readFile(path);
    EXPECT_TRUE(want == text) << path.string()
                              << " differs from what is rendered now (- golden, + rendered):\n"
                              << unifiedDiff(want, text)
                              << "If the change is intended, regenerate the golden files and "
                                 "review their diff:\n  "
                              << kRegenerate;
  }
}

TEST(RenderGoldenDiff, ShowsTheChangedLinesInContext) {
  const std::string want = "a\nb\nc\nd\ne\nf\ng\nh\ni\nj\nk\nl\n";
  const std::string got = "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\nk\nl\nm\n";
  EXPECT_EQ(unifiedDiff(want, got),
            "@@ golden line 2, rendered line 2 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n"
            "@@ golden line 10, rendered line 10 @@\n j\n k\n l\n+m\n");
  EXPECT_EQ(unifiedDiff(want, want), "");
}

// Test names allow letters, digits and underscores only.
std::string testName(const ::testing::TestParamInfo<std::string>& sample) {
  std::string name = sample.param;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Samples, RenderGolden, ::testing::ValuesIn(sampleNames()), testName);

// No golden file is left over from a sample or region that is gone.
TEST(RenderGoldenFiles, NoStaleFiles) {
  std::set<fs::path> expected;
  for (const std::string& name : sampleNames()) {
    const Sample s = loadSample(name);
    for (const auto& r : s.spec.regions) expected.insert(goldenPath(s.name, r.name));
  }
  ASSERT_FALSE(expected.empty());
  if (!fs::exists(GEO_GOLDEN_DIR)) return;
  for (const auto& entry : fs::recursive_directory_iterator(GEO_GOLDEN_DIR)) {
    if (entry.path().extension() != ".yaml" || expected.count(entry.path())) continue;
    if (updating()) {
      fs::remove(entry.path());
      std::cout << "removed " << entry.path().string() << "\n";
    } else {
      ADD_FAILURE() << entry.path().string()
                    << " belongs to no sample and region; regenerate with\n  " << kRegenerate;
    }
  }
}

}  // namespace
}  // namespace geo::reconcile
