// Keys, proofs and allow-lists (transport/auth.h).
#include "vigil/transport/auth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

namespace vigil::transport {
namespace {

std::string Msg(const Status& s) { return std::string(s.message()); }

TEST(AuthTest, ProofsBindKeyHelloAndBothNoncesAndDifferByDirection) {
  const std::string key(32, '\x01');
  Hello h{"edge-1", 3, kProtocolVersion, 0, {"person"}, {{"cam", 1}}, RandomNonce()};
  const Nonce na = RandomNonce();
  const std::string pa = AggregatorProof(key, h, na), pe = EdgeProof(key, h, na);
  EXPECT_EQ(pa.size(), kProofBytes);
  EXPECT_EQ(pe.size(), kProofBytes);
  EXPECT_NE(pa, pe);  // one side's proof is never the other's
  EXPECT_EQ(AggregatorProof(key, h, na), pa);  // deterministic
  EXPECT_NE(AggregatorProof(std::string(32, '\x02'), h, na), pa);
  EXPECT_NE(AggregatorProof(key, h, RandomNonce()), pa);  // a new aggregator nonce: a replay fails
  Hello promoted = h;
  promoted.flags = kHelloPromote;  // a rewritten Hello
  EXPECT_NE(EdgeProof(key, promoted, na), pe);
  Hello other_nonce = h;
  other_nonce.nonce = RandomNonce();
  EXPECT_NE(AggregatorProof(key, other_nonce, na), pa);
  EXPECT_TRUE(ProofMatches(pa, pa));
  EXPECT_FALSE(ProofMatches(pa, pe));
  EXPECT_FALSE(ProofMatches(pa, pa.substr(0, 31)));
  EXPECT_FALSE(ProofMatches("", ""));  // no proof never matches
}

TEST(AuthTest, HexKeysAndTheirErrors) {
  StatusOr<std::string> k = ParseHexKey("  00112233445566778899aabbccddeeff\n", "key_file k");
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->size(), 16u);
  EXPECT_EQ(static_cast<uint8_t>((*k)[15]), 0xFF);
  EXPECT_EQ(Msg(ParseHexKey("abc", "key_file k").status()), "key_file k: a key is an even number of hex digits");
  EXPECT_EQ(Msg(ParseHexKey("zz112233445566778899aabbccddeeff", "key_file k").status()),
            "key_file k: not a hex key (character 1)");
  EXPECT_EQ(Msg(ParseHexKey("0011", "key_file k").status()),
            "key_file k: a key needs at least 16 bytes (32 hex digits), this one has 2; make one with `openssl rand "
            "-hex 32`");
  const std::string fresh = NewKeyHex();
  EXPECT_EQ(fresh.size(), 64u);
  EXPECT_NE(fresh, NewKeyHex());
  EXPECT_TRUE(ParseHexKey(fresh, "new").ok());
}

TEST(AuthTest, KeyStoreFromYamlNamesTheEdgeNeverTheKey) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / ("vigil_keys_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.yaml").string(), bad = (dir / "bad.yaml").string();
  std::ofstream(good) << "edge-1: " << std::string(64, 'a') << "\n\"edge 2\": " << std::string(32, '0') << "\n";
  std::ofstream(bad) << "edge-1: " << std::string(64, 'a') << "\nedge-2: secretsecret\n";
  StatusOr<KeyStore> ks = KeyStore::Load(good);
  ASSERT_TRUE(ks.ok()) << ks.status();
  EXPECT_EQ(ks->size(), 2u);
  ASSERT_NE(ks->Find("edge 2"), nullptr);
  EXPECT_EQ(*ks->Find("edge 2"), std::string(16, '\0'));
  EXPECT_EQ(ks->Find("edge-3"), nullptr);
  const std::string error = Msg(KeyStore::Load(bad).status());
  EXPECT_EQ(error, "keys_file " + bad + ": edge 'edge-2': not a hex key (character 1)");
  EXPECT_EQ(error.find("secret"), std::string::npos);
  EXPECT_EQ(KeyStore::Load((dir / "none.yaml").string()).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove_all(dir);
}

TEST(AllowListTest, MatchesIpv4Ipv6AndMappedPeers) {
  StatusOr<AllowList> a = AllowList::Parse({"127.0.0.1/32", "10.0.0.0/8", "192.168.4.0/23", "::1", "fd00::/8"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->Allows("127.0.0.1:40212"));
  EXPECT_FALSE(a->Allows("127.0.0.2:40212"));
  EXPECT_TRUE(a->Allows("10.255.0.7:1"));
  EXPECT_FALSE(a->Allows("11.0.0.1:1"));
  EXPECT_TRUE(a->Allows("192.168.5.200:9"));
  EXPECT_FALSE(a->Allows("192.168.6.1:9"));
  EXPECT_TRUE(a->Allows("[::1]:7400"));
  EXPECT_TRUE(a->Allows("::1"));
  EXPECT_TRUE(a->Allows("[fd12:3456::1]:1"));
  EXPECT_FALSE(a->Allows("[fe80::1]:1"));
  EXPECT_TRUE(a->Allows("[::ffff:10.1.2.3]:5"));  // IPv4-mapped: matched as IPv4
  EXPECT_TRUE(a->Allows("127.0.0.1"));
  EXPECT_FALSE(a->Allows("not-an-address:1"));
  EXPECT_FALSE(a->Allows(""));
  StatusOr<AllowList> everyone = AllowList::Parse({"0.0.0.0/0", "::/0"});
  ASSERT_TRUE(everyone.ok());
  EXPECT_TRUE(everyone->Allows("203.0.113.9:1"));
  EXPECT_TRUE(everyone->Allows("[2001:db8::1]:1"));
}

TEST(AllowListTest, BadEntriesAreNamed) {
  EXPECT_EQ(Msg(AllowList::Parse({"10.0.0.0/33"}).status()), "allow: '10.0.0.0/33': prefix over 32");
  EXPECT_EQ(Msg(AllowList::Parse({"10.0.0.1/8"}).status()), "allow: '10.0.0.1/8': host bits set past /8");
  EXPECT_EQ(Msg(AllowList::Parse({"localhost"}).status()), "allow: 'localhost': not an IPv4 or IPv6 address");
  EXPECT_EQ(Msg(AllowList::Parse({"10.0.0.0/x"}).status()), "allow: '10.0.0.0/x': the prefix length is not a number");
}

}  // namespace
}  // namespace vigil::transport
