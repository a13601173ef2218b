// Output paths of `geotrain local`: the up-front check of files named by
// flags, and the rollback of a run that fails before its workers start.

#include "worker/local/outputs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace geo::local {
namespace {

namespace fs = std::filesystem;

class LocalOutputs : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "geo-local-outputs-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ignored;
    fs::permissions(dir_ / "locked", fs::perms::owner_all, ignored);
    fs::remove_all(dir_, ignored);
  }

  std::string errorOf(const fs::path& path) {
    const Status s = checkOutputFile("--csv", path, dir_ / "run");
    EXPECT_FALSE(s.ok()) << path;
    return s.message();
  }

  fs::path dir_;
};

TEST_F(LocalOutputs, CheckNamesTheFlagThePathAndTheProblem) {
  EXPECT_TRUE(checkOutputFile("--csv", dir_ / "new.csv", dir_ / "run").ok());
  // The run folder does not exist yet: the run creates it.
  EXPECT_TRUE(checkOutputFile("--csv", dir_ / "run" / "p.csv", dir_ / "run").ok());
  std::ofstream(dir_ / "existing.csv") << "x";
  EXPECT_TRUE(checkOutputFile("--csv", dir_ / "existing.csv", dir_ / "run").ok());

  const fs::path missing = dir_ / "missing" / "p.csv";
  EXPECT_EQ(errorOf(missing), "--csv " + missing.string() + ": the folder " +
                                  (dir_ / "missing").string() + " does not exist");
  const fs::path underFile = dir_ / "existing.csv" / "p.csv";
  EXPECT_EQ(errorOf(underFile), "--csv " + underFile.string() + ": " +
                                    (dir_ / "existing.csv").string() + " is not a folder");
  EXPECT_EQ(errorOf(dir_), "--csv " + dir_.string() + ": is a folder (allowed: a file path)");
  // A folder inside the run folder is not made by the run.
  EXPECT_NE(errorOf(dir_ / "run" / "sub" / "p.csv").find("does not exist"), std::string::npos);

  if (::geteuid() != 0) {  // root may write anywhere
    fs::create_directory(dir_ / "locked");
    std::ofstream(dir_ / "locked" / "old.csv") << "x";
    fs::permissions(dir_ / "locked" / "old.csv", fs::perms::owner_read);
    fs::permissions(dir_ / "locked", fs::perms::owner_read | fs::perms::owner_exec);
    EXPECT_NE(errorOf(dir_ / "locked" / "new.csv").find("cannot create a file in"),
              std::string::npos);
    EXPECT_NE(errorOf(dir_ / "locked" / "old.csv").find("cannot write the file"),
              std::string::npos);
  }
}

TEST_F(LocalOutputs, RollbackTakesBackWhatTheRunCreated) {
  const fs::path run = dir_ / "a" / "b" / "run";
  const fs::path csv = dir_ / "p.csv";
  std::ofstream(dir_ / "kept.csv") << "before";
  {
    OutputRollback rollback;
    rollback.folder(run);
    fs::create_directories(run / "logs");
    std::ofstream(run / "logs" / "launcher.log") << "x";
    rollback.file(csv);
    std::ofstream(csv) << "header";
    rollback.file(dir_ / "kept.csv");
    std::ofstream(dir_ / "kept.csv") << "overwritten";
  }
  EXPECT_FALSE(fs::exists(dir_ / "a")) << "parents the run created go too";
  EXPECT_FALSE(fs::exists(csv));
  EXPECT_TRUE(fs::exists(dir_ / "kept.csv")) << "a file that existed stays";

  // An empty run folder that existed stays, and is empty again.
  fs::create_directory(dir_ / "empty");
  {
    OutputRollback rollback;
    rollback.folder(dir_ / "empty");
    fs::create_directories(dir_ / "empty" / "keys");
    std::ofstream(dir_ / "empty" / "worker-0.yaml") << "x";
  }
  ASSERT_TRUE(fs::is_directory(dir_ / "empty"));
  EXPECT_TRUE(fs::is_empty(dir_ / "empty"));

  // keep(): a run that started keeps everything.
  {
    OutputRollback rollback;
    rollback.folder(run);
    fs::create_directories(run);
    rollback.file(csv);
    std::ofstream(csv) << "header";
    rollback.keep();
  }
  EXPECT_TRUE(fs::exists(run));
  EXPECT_TRUE(fs::exists(csv));
}

}  // namespace
}  // namespace geo::local
