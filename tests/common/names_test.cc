// The one DNS-label rule that region names, member cluster names and the
// TrainingJob's references all use (common/names.h).

#include "common/names.h"

#include <gtest/gtest.h>

#include <string>

namespace geo {
namespace {

TEST(Names, DnsLabels) {
  for (const char* ok : {"a", "london", "us-east-1", "0", "9a", "a-b-c"}) {
    EXPECT_TRUE(isDnsLabel(ok)) << ok;
  }
  EXPECT_TRUE(isDnsLabel(std::string(63, 'a')));
  for (const char* bad : {"", "-a", "a-", "London", "us_east", "a.b", "a b", "é"}) {
    EXPECT_FALSE(isDnsLabel(bad)) << bad;
  }
  EXPECT_FALSE(isDnsLabel(std::string(64, 'a')));
}

// The rule in words, one wording wherever a DNS label is refused; each
// caller says what kind of name it is.
TEST(Names, DnsLabelRuleInWords) {
  EXPECT_EQ(dnsLabelAllowed("a region name"),
            "a region name: lowercase letters, digits and '-', starting and ending with a letter "
            "or digit, at most 63 characters");
  EXPECT_EQ(dnsLabelAllowed("x"), "x: " + std::string(kDnsLabelRule));
}

TEST(Names, DnsSubdomains) {
  for (const char* ok : {"a", "my-secret", "geotrain.io", "a.b-c.d"}) {
    EXPECT_TRUE(isDnsSubdomain(ok)) << ok;
  }
  for (const char* bad : {"", ".", "a.", ".a", "a..b", "A.b", "a.-b", "a_b.c"}) {
    EXPECT_FALSE(isDnsSubdomain(bad)) << bad;
  }
  // 253 characters at most: 4 labels of 63 and the dots make 255.
  const std::string label(63, 'a');
  EXPECT_TRUE(isDnsSubdomain(label + "." + label + "." + label + "." + std::string(61, 'b')));
  EXPECT_FALSE(isDnsSubdomain(label + "." + label + "." + label + "." + label));
}

}  // namespace
}  // namespace geo
