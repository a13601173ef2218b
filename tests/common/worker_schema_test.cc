#include "common/worker_schema.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

namespace geo {
namespace {

// The keys toYaml() writes, as section.key paths in its order.
std::vector<std::string> pathsInYaml(const std::string& yaml) {
  std::vector<std::string> paths;
  std::istringstream in(yaml);
  std::string line;
  std::string section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#' || line[0] == '-' || line.rfind("    ", 0) == 0) continue;
    if (line[0] != ' ') {
      section = line.substr(0, line.find(':'));
      continue;
    }
    if (line.rfind("  - ", 0) == 0) continue;  // an item of a block list
    paths.push_back(section + "." + line.substr(2, line.find(':') - 2));
  }
  return paths;
}

TEST(WorkerSchema, ListsEveryKeyToYamlWritesInItsOrder) {
  std::vector<std::string> schemaPaths;
  for (const KeySpec& key : workerConfigSchema()) {
    schemaPaths.push_back(key.path);
    EXPECT_EQ(key.path, key.section + "." + key.name);
    EXPECT_FALSE(key.doc.empty()) << key.path;
    EXPECT_FALSE(key.allowed.empty()) << key.path;
  }
  EXPECT_EQ(schemaPaths, pathsInYaml(toYaml(WorkerConfig{})));
  std::vector<std::string> sections;
  for (const KeySpec& key : workerConfigSchema()) {
    if (sections.empty() || sections.back() != key.section) sections.push_back(key.section);
  }
  EXPECT_EQ(sections, workerConfigSections());
}

TEST(WorkerSchema, DefaultsAreThoseOfAWorkerConfig) {
  const WorkerConfig defaults;
  for (const KeySpec& key : workerConfigSchema()) {
    EXPECT_EQ(workerKeyValue(defaults, key), key.defaultValue) << key.path;
  }
  auto lr = lookupWorkerKey("training.lr");
  ASSERT_TRUE(lr.ok());
  EXPECT_EQ((*lr)->defaultValue, KeyValue(0.05));
  auto delay = lookupWorkerKey("sync.delay");
  ASSERT_TRUE(delay.ok());
  EXPECT_EQ((*delay)->defaultValue, KeyValue());  // auto
}

TEST(WorkerSchema, TypesSayHowAValueIsWritten) {
  auto type = [](std::string_view path) {
    auto key = lookupWorkerKey(path);
    EXPECT_TRUE(key.ok()) << path;
    return key.ok() ? (*key)->type : KeyType::kString;
  };
  EXPECT_EQ(type("job.seed"), KeyType::kUnsigned);
  EXPECT_EQ(type("training.steps"), KeyType::kInteger);
  EXPECT_EQ(type("training.lr"), KeyType::kNumber);
  EXPECT_EQ(type("training.nesterov"), KeyType::kBoolean);
  EXPECT_EQ(type("sync.codec"), KeyType::kString);
  EXPECT_EQ(type("transport.peers"), KeyType::kStringList);
  EXPECT_EQ(type("transport.links"), KeyType::kStringMap);
  EXPECT_EQ(type("sync.period"), KeyType::kInteger);
  EXPECT_TRUE((*lookupWorkerKey("sync.period"))->takesAuto);
  EXPECT_TRUE((*lookupWorkerKey("dataset.shardIndex"))->takesNull);
  EXPECT_FALSE((*lookupWorkerKey("training.steps"))->takesAuto);
}

// What the limits say is what setting a value accepts, and a refusal says
// `allowed`: both come from the same rule.
TEST(WorkerSchema, LimitsAgreeWithWhatSettingAccepts) {
  auto accepts = [](const KeySpec& key, const std::string& text) {
    WorkerConfig config;
    return setWorkerKey(config, key, text).ok();
  };
  for (const KeySpec& key : workerConfigSchema()) {
    const KeyLimits& limits = key.limits;
    for (const std::string& choice : limits.choices) {
      EXPECT_TRUE(accepts(key, choice)) << key.path << " " << choice;
    }
    if (!limits.choices.empty()) {
      WorkerConfig config;
      const Status refused = setWorkerKey(config, key, "nonesuch");
      EXPECT_EQ(refused.message(),
                fmt::format("nonesuch is not allowed (allowed: {})", key.allowed))
          << key.path;
      EXPECT_EQ(accepts(key, ""), limits.emptyAllowed) << key.path;
    }
    const bool integer = key.type == KeyType::kInteger || key.type == KeyType::kUnsigned;
    const double step = integer ? 1 : 1e-9;
    if (limits.minimum) {
      const double m = *limits.minimum;
      EXPECT_EQ(accepts(key, fmt::format("{}", m)), !limits.exclusiveMinimum) << key.path;
      EXPECT_TRUE(accepts(key, fmt::format("{}", m + step))) << key.path;
      if (!(limits.zeroAllowed && m - step <= 0)) {
        EXPECT_FALSE(accepts(key, fmt::format("{}", m - step))) << key.path;
      }
    }
    if (limits.maximum) {
      const double m = *limits.maximum;
      EXPECT_EQ(accepts(key, fmt::format("{}", m)), !limits.exclusiveMaximum) << key.path;
      EXPECT_FALSE(accepts(key, fmt::format("{}", m + (integer ? 1 : 1e-3)))) << key.path;
    }
    if (limits.zeroAllowed) {
      EXPECT_TRUE(accepts(key, "0")) << key.path;
    }
    if (key.type != KeyType::kString && key.type != KeyType::kStringList &&
        key.type != KeyType::kStringMap) {
      EXPECT_EQ(accepts(key, "auto"), key.takesAuto) << key.path;
      EXPECT_EQ(accepts(key, "null"), key.takesNull) << key.path;
    }
  }
}

TEST(WorkerSchema, SettingAKeyReadsItsTextAsTheParserDoes) {
  auto lr = lookupWorkerKey("training.lr");
  ASSERT_TRUE(lr.ok());
  WorkerConfig config;
  EXPECT_TRUE(setWorkerKey(config, **lr, "0.25").ok());
  EXPECT_EQ(config.training.lr, 0.25);
  // Refused without the path, which the caller reports its own way, and
  // without a change.
  const Status refused = setWorkerKey(config, **lr, "0");
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused.message(), "0 is not allowed (allowed: a number > 0)");
  EXPECT_EQ(config.training.lr, 0.25);
  auto delay = lookupWorkerKey("sync.delay");
  ASSERT_TRUE(delay.ok());
  EXPECT_TRUE(setWorkerKey(config, **delay, "3").ok());
  EXPECT_EQ(workerKeyValue(config, **delay), KeyValue(int64_t{3}));
  EXPECT_TRUE(setWorkerKey(config, **delay, "auto").ok());
  EXPECT_EQ(config.sync.delay, std::nullopt);
}

TEST(WorkerSchema, AnUnknownKeyIsNotFoundWithTheParsersWords) {
  auto typo = lookupWorkerKey("training.lrr");
  ASSERT_FALSE(typo.ok());
  EXPECT_EQ(typo.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(typo.status().message().rfind("unknown key (allowed: steps, batchSize, ", 0), 0)
      << typo.status().message();
  EXPECT_NE(typo.status().message().find("; did you mean 'lr'?"), std::string::npos);
  // The same words as --set, which adds the path.
  WorkerConfig config;
  EXPECT_EQ(applyOverride(config, "training.lrr", "1").message(),
            "training.lrr: " + typo.status().message());

  auto section = lookupWorkerKey("trainin.lr");
  ASSERT_FALSE(section.ok());
  EXPECT_EQ(section.status().code(), StatusCode::kNotFound);
  EXPECT_NE(section.status().message().find("(allowed: job, worker, model,"), std::string::npos)
      << section.status().message();
  EXPECT_NE(section.status().message().find("did you mean 'training'?"), std::string::npos);
  EXPECT_FALSE(lookupWorkerKey("training").ok());
}

TEST(WorkerSchema, ChoicesInProse) {
  EXPECT_EQ(workerKeyChoices("sync.algorithm"), "none, allreduce, dts or swarm");
  EXPECT_EQ(workerKeyChoices("sync.bits"), "2, 4 or 8");
  EXPECT_EQ(workerKeyChoices("log.format"), "text or json");
}

TEST(WorkerSchema, AProblemNamesItsKeyApartFromItsWords) {
  WorkerConfig config;
  EXPECT_EQ(workerConfigProblem(config), std::nullopt);
  config.worker.worldSize = 2;
  config.worker.rank = 3;
  const auto problem = workerConfigProblem(config);
  ASSERT_TRUE(problem.has_value());
  EXPECT_EQ(*problem,
            (ConfigProblem{"worker.rank",
                           "3 is not allowed (allowed: 0..1, below worker.worldSize = 2)"}));
  EXPECT_EQ(validateWorkerConfig(config).message(), problem->path + ": " + problem->detail);

  // A key's own rule comes first, as validateWorkerConfig() reports it.
  config.training.lr = -1;
  EXPECT_EQ(workerConfigProblem(config),
            (ConfigProblem{"training.lr", "-1 is not allowed (allowed: a number > 0)"}));

  WorkerConfig both;
  both.model.torchscript = "m.pt";
  EXPECT_EQ(
      workerConfigProblem(both),
      (ConfigProblem{"model", "builtin and torchscript are both set (allowed: one of them)"}));
}

}  // namespace
}  // namespace geo
