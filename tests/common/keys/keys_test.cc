#include "common/keys/keys.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>

namespace geo::keys {
namespace {

namespace fs = std::filesystem;

// The keypairs printed in ZeroMQ's zmq_curve(7) manual page.
constexpr const char* kServerPublic = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7";
constexpr const char* kServerSecret = "JTKVSB%%)wK0E.X)V>+}o?pNmC{O&4W4b!Ni{Lh6";
constexpr const char* kClientPublic = "Yne@$w-vo<fVvi]a<NY6T1ed:M$fCG*[IaLV{hID";
constexpr const char* kClientSecret = "D:)Q[IlAW!ahhC2ac:9*A}h:p?([4%wOTJ%JR%cs";

// A key whose 5-character groups are all "#####", i.e. 84 * (85^4 + ... + 1)
// > 2^32 - 1: Z85 characters, but not a valid encoding.
const std::string kOverflowKey(40, '#');

mode_t modeOf(const fs::path& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void writeFile(const fs::path& path, const std::string& contents, mode_t mode) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << contents;
  }
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

void expectMentions(const Status& status, std::initializer_list<std::string> mentions) {
  ASSERT_FALSE(status.ok());
  for (const auto& m : mentions) {
    EXPECT_NE(status.message().find(m), std::string::npos)
        << "'" << status.message() << "' does not mention '" << m << "'";
  }
}

class KeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "geotrain-keys-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  fs::path dir_;
};

TEST(Z85Key, AcceptsOnlyFortyValidCharacters) {
  EXPECT_TRUE(isZ85Key(kServerPublic));
  EXPECT_TRUE(isZ85Key(kClientSecret));
  EXPECT_FALSE(isZ85Key(""));
  EXPECT_FALSE(isZ85Key(std::string(kServerPublic).substr(0, 39)));
  EXPECT_FALSE(isZ85Key(std::string(kServerPublic) + "0"));
  for (char bad : {'"', '\'', ',', ';', '_', '`', '|', '~', ' ', '\n', '\0', '\\'}) {
    std::string key = kServerPublic;
    key[17] = bad;
    EXPECT_FALSE(isZ85Key(key)) << static_cast<int>(bad);
  }
  EXPECT_FALSE(isZ85Key(kOverflowKey));
}

TEST(KeyPair, MatchesZeroMqsReferenceKeys) {
  auto server = publicKeyOf(kServerSecret);
  ASSERT_TRUE(server.ok()) << server.status().toString();
  EXPECT_EQ(*server, kServerPublic);
  auto client = publicKeyOf(kClientSecret);
  ASSERT_TRUE(client.ok()) << client.status().toString();
  EXPECT_EQ(*client, kClientPublic);
}

TEST(KeyPair, GeneratedKeysAreValidFreshAndAgreeWithZeroMq) {
  const CurveKeyPair a = generateKeyPair();
  const CurveKeyPair b = generateKeyPair();
  EXPECT_TRUE(isZ85Key(a.publicKey));
  EXPECT_TRUE(isZ85Key(a.secretKey));
  EXPECT_NE(a.secretKey, b.secretKey);
  EXPECT_NE(a.publicKey, b.publicKey);

  auto derived = publicKeyOf(a.secretKey);
  ASSERT_TRUE(derived.ok()) << derived.status().toString();
  EXPECT_EQ(*derived, a.publicKey);

  // libzmq's own derivation is an independent check of the encoding.
  std::array<char, 41> zmqPublic{};
  ASSERT_EQ(zmq_curve_public(zmqPublic.data(), a.secretKey.c_str()), 0);
  EXPECT_EQ(std::string(zmqPublic.data()), a.publicKey);
}

TEST(KeyPair, PublicKeyOfRejectsInvalidSecrets) {
  expectMentions(publicKeyOf("short").status(), {"secret key", "40", "got 5"});
  std::string bad = kServerSecret;
  bad[3] = '~';
  expectMentions(publicKeyOf(bad).status(), {"character 4", "'~'"});
  expectMentions(publicKeyOf(kOverflowKey).status(), {"2^32"});
}

TEST_F(KeysTest, WriteThenLoadRoundTrips) {
  const CurveKeyPair keys = generateKeyPair();
  const fs::path out = dir_ / "nested" / "keys";  // neither exists yet
  ASSERT_TRUE(writeKeyPair(keys, out, "london-0").ok());

  const fs::path secretPath = out / "london-0.key";
  const fs::path publicPath = out / "london-0.pub";
  EXPECT_EQ(modeOf(secretPath), 0600u);
  EXPECT_EQ(modeOf(publicPath), 0644u);
  EXPECT_EQ(modeOf(out), 0700u);
  EXPECT_EQ(readFile(secretPath), keys.secretKey + "\n");
  EXPECT_EQ(readFile(publicPath), keys.publicKey + "\n");

  auto secret = loadSecretKey(secretPath);
  ASSERT_TRUE(secret.ok()) << secret.status().toString();
  EXPECT_EQ(*secret, keys.secretKey);
  auto pub = loadPublicKey(publicPath);
  ASSERT_TRUE(pub.ok()) << pub.status().toString();
  EXPECT_EQ(*pub, keys.publicKey);

  auto derived = publicKeyOf(*secret);
  ASSERT_TRUE(derived.ok());
  EXPECT_EQ(*derived, *pub);
}

TEST_F(KeysTest, ModesDoNotDependOnTheUmask) {
  for (mode_t mask : {mode_t{0}, mode_t{022}, mode_t{077}}) {
    const mode_t previous = ::umask(mask);
    const std::string name = "umask" + std::to_string(mask);
    const Status status = writeKeyPair(generateKeyPair(), dir_, name);
    ::umask(previous);
    ASSERT_TRUE(status.ok()) << status.toString();
    EXPECT_EQ(modeOf(dir_ / (name + ".key")), 0600u) << mask;
    EXPECT_EQ(modeOf(dir_ / (name + ".pub")), 0644u) << mask;
  }
}

TEST_F(KeysTest, AcceptsADirectoryWithATrailingSlash) {
  const CurveKeyPair keys = generateKeyPair();
  ASSERT_TRUE(writeKeyPair(keys, dir_.string() + "/fresh/", "w").ok());
  EXPECT_EQ(modeOf(dir_ / "fresh"), 0700u);
  EXPECT_TRUE(fs::exists(dir_ / "fresh" / "w.key"));
}

TEST_F(KeysTest, NeverOverwritesExistingKeys) {
  const CurveKeyPair first = generateKeyPair();
  ASSERT_TRUE(writeKeyPair(first, dir_, "worker").ok());

  const Status again = writeKeyPair(generateKeyPair(), dir_, "worker");
  EXPECT_EQ(again.code(), StatusCode::kAlreadyExists);
  expectMentions(again, {(dir_ / "worker.key").string(), "already exists"});
  EXPECT_EQ(readFile(dir_ / "worker.key"), first.secretKey + "\n");
  EXPECT_EQ(readFile(dir_ / "worker.pub"), first.publicKey + "\n");
}

TEST_F(KeysTest, AnExistingPublicKeyLeavesNoSecretKeyBehind) {
  writeFile(dir_ / "w.pub", "not mine\n", 0644);
  const Status status = writeKeyPair(generateKeyPair(), dir_, "w");
  EXPECT_EQ(status.code(), StatusCode::kAlreadyExists);
  expectMentions(status, {(dir_ / "w.pub").string()});
  EXPECT_FALSE(fs::exists(dir_ / "w.key"));
  EXPECT_EQ(readFile(dir_ / "w.pub"), "not mine\n");
}

TEST_F(KeysTest, ASymlinkIsNeverFollowedOrReplaced) {
  const fs::path target = dir_ / "target";
  fs::create_symlink(target, dir_ / "s.key");
  const Status status = writeKeyPair(generateKeyPair(), dir_, "s");
  EXPECT_EQ(status.code(), StatusCode::kAlreadyExists);
  EXPECT_FALSE(fs::exists(target));
}

TEST_F(KeysTest, RejectsNamesThatAreNotPlainFileNames) {
  for (const char* name : {"", ".", "..", "a/b", "../escape"}) {
    const Status status = writeKeyPair(generateKeyPair(), dir_, name);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << name;
    expectMentions(status, {"key name"});
  }
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(KeysTest, RejectsAPairWhoseHalvesDoNotMatch) {
  const CurveKeyPair mixed{.publicKey = kServerPublic, .secretKey = kClientSecret};
  expectMentions(writeKeyPair(mixed, dir_, "mixed"), {"does not belong"});
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(KeysTest, ReportsAnOutputPathThatIsAFile) {
  writeFile(dir_ / "file", "x", 0644);
  const Status status = writeKeyPair(generateKeyPair(), dir_ / "file", "w");
  expectMentions(status, {(dir_ / "file").string(), "not a directory"});
}

TEST_F(KeysTest, ReportsAnUnwritableDirectory) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can write anywhere";
  const fs::path locked = dir_ / "locked";
  fs::create_directory(locked);
  ASSERT_EQ(::chmod(locked.c_str(), 0500), 0);
  const Status status = writeKeyPair(generateKeyPair(), locked, "w");
  EXPECT_EQ(status.code(), StatusCode::kPermissionDenied);
  expectMentions(status, {(locked / "w.key").string(), "Permission denied"});
  ::chmod(locked.c_str(), 0700);
}

TEST_F(KeysTest, LoadReportsAMissingFile) {
  const fs::path path = dir_ / "absent.key";
  auto secret = loadSecretKey(path);
  EXPECT_EQ(secret.status().code(), StatusCode::kNotFound);
  expectMentions(secret.status(), {path.string(), "does not exist"});
  auto pub = loadPublicKey(dir_ / "absent.pub");
  EXPECT_EQ(pub.status().code(), StatusCode::kNotFound);
  expectMentions(pub.status(), {(dir_ / "absent.pub").string(), "public key"});
}

TEST_F(KeysTest, LoadReportsAnUnreadableFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root can read anything";
  const fs::path path = dir_ / "sealed.pub";
  writeFile(path, std::string(kServerPublic) + "\n", 0000);
  auto pub = loadPublicKey(path);
  EXPECT_EQ(pub.status().code(), StatusCode::kPermissionDenied);
  expectMentions(pub.status(), {path.string(), "Permission denied"});
}

TEST_F(KeysTest, LoadReportsTheWrongSize) {
  const fs::path path = dir_ / "size.pub";
  struct Case {
    std::string contents;
    std::string size;
  };
  const std::string key = kServerPublic;
  const Case cases[] = {
      {"", "0 bytes"},
      {key.substr(0, 39), "39 bytes"},
      {key.substr(0, 39) + "\n", "40 bytes"},  // a newline does not make up for a character
      {key + "\n\n", "42 bytes"},
      {key + key, "80 bytes"},
      {std::string(1000, 'a'), "1000 bytes"},
  };
  for (const Case& c : cases) {
    writeFile(path, c.contents, 0644);
    auto pub = loadPublicKey(path);
    ASSERT_FALSE(pub.ok()) << c.size;
    EXPECT_EQ(pub.status().code(), StatusCode::kInvalidArgument);
    if (c.contents.size() == 40) {
      // 39 characters and a newline: 40 bytes, but the newline is not Z85.
      expectMentions(pub.status(), {path.string(), "character 40"});
    } else {
      expectMentions(pub.status(), {path.string(), c.size, "expected 40"});
    }
  }
  writeFile(path, key + "\r", 0644);  // a CR line ending
  expectMentions(loadPublicKey(path).status(), {path.string(), "byte 41", "0x0d"});
  writeFile(path, key + "x", 0644);
  expectMentions(loadPublicKey(path).status(), {path.string(), "byte 41", "'x'"});
}

TEST_F(KeysTest, LoadAcceptsAKeyWithoutTheNewline) {
  const fs::path path = dir_ / "bare.key";
  writeFile(path, kServerSecret, 0600);
  auto secret = loadSecretKey(path);
  ASSERT_TRUE(secret.ok()) << secret.status().toString();
  EXPECT_EQ(*secret, kServerSecret);
}

TEST_F(KeysTest, LoadReportsCharactersThatAreNotZ85) {
  const fs::path path = dir_ / "chars.key";
  std::string key = kServerSecret;
  key[9] = '"';
  writeFile(path, key + "\n", 0600);
  auto secret = loadSecretKey(path);
  EXPECT_EQ(secret.status().code(), StatusCode::kInvalidArgument);
  expectMentions(secret.status(), {path.string(), "character 10", "'\"'", "not a Z85"});

  key[9] = '\x01';
  writeFile(path, key + "\n", 0600);
  expectMentions(loadSecretKey(path).status(), {path.string(), "character 10", "0x01"});

  writeFile(path, kOverflowKey + "\n", 0600);
  expectMentions(loadSecretKey(path).status(), {path.string(), "not a valid Z85 key"});
}

TEST_F(KeysTest, LoadRefusesASecretKeyOthersCanAccess) {
  const CurveKeyPair keys = generateKeyPair();
  ASSERT_TRUE(writeKeyPair(keys, dir_, "w").ok());
  const fs::path path = dir_ / "w.key";
  for (mode_t mode : {mode_t{0644}, mode_t{0640}, mode_t{0604}, mode_t{0610}, mode_t{0601}}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto secret = loadSecretKey(path);
    EXPECT_EQ(secret.status().code(), StatusCode::kPermissionDenied) << mode;
    char octal[8];
    std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(mode));
    expectMentions(secret.status(),
                   {path.string(), octal, "group or others", "chmod 600 " + path.string()});
  }
  // Owner-only modes are fine, and public keys are not mode-checked.
  ASSERT_EQ(::chmod(path.c_str(), 0400), 0);
  EXPECT_TRUE(loadSecretKey(path).ok());
  EXPECT_TRUE(loadPublicKey(dir_ / "w.pub").ok());
}

// How Kubernetes mounts a Secret into a pod with an fsGroup: root:<group>
// 0440. Admitted only when asked for; others may still never read.
TEST_F(KeysTest, GroupReadIsAdmittedOnlyWhenAskedFor) {
  const CurveKeyPair keys = generateKeyPair();
  ASSERT_TRUE(writeKeyPair(keys, dir_, "w").ok());
  const fs::path path = dir_ / "w.key";
  for (mode_t mode : {mode_t{0440}, mode_t{0640}, mode_t{0600}}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto secret = loadSecretKey(path, SecretKeyAccess::kOwnerAndGroupRead);
    ASSERT_TRUE(secret.ok()) << mode << ": " << secret.status().toString();
    EXPECT_EQ(*secret, keys.secretKey);
  }
  ASSERT_EQ(::chmod(path.c_str(), 0440), 0);
  EXPECT_EQ(loadSecretKey(path).status().code(), StatusCode::kPermissionDenied);
  for (mode_t mode : {mode_t{0444}, mode_t{0660}, mode_t{0604}, mode_t{0650}}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    auto secret = loadSecretKey(path, SecretKeyAccess::kOwnerAndGroupRead);
    EXPECT_EQ(secret.status().code(), StatusCode::kPermissionDenied) << mode;
    expectMentions(secret.status(), {path.string(), "chmod 640"});
  }
}

TEST_F(KeysTest, LoadRefusesADirectoryOrAFifo) {
  auto pub = loadPublicKey(dir_);
  expectMentions(pub.status(), {dir_.string(), "not a regular file"});
  // A FIFO must be refused, not waited on for a writer that never comes.
  const fs::path fifo = dir_ / "fifo.key";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expectMentions(loadSecretKey(fifo).status(), {fifo.string(), "not a regular file"});
}

}  // namespace
}  // namespace geo::keys
