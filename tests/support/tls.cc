#include "tests/support/tls.h"

#include <filesystem>
#include <fstream>
#include <iterator>

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "common/enforce.h"

namespace geo::testapi {

namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, PkeyDeleter>;
using CertPtr = std::unique_ptr<X509, X509Deleter>;

KeyPtr newKey() {
  KeyPtr key(EVP_EC_gen("P-256"));
  GEO_ENFORCE(key != nullptr, "EVP_EC_gen(P-256) failed");
  return key;
}

void addExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  GEO_ENFORCE(ext != nullptr, "X509V3_EXT_conf_nid({}, {}) failed", nid, value);
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

// A certificate for `key` named `commonName`, signed by `issuerKey` as
// `issuer` (nullptr: self-signed).
CertPtr newCert(EVP_PKEY* key, const char* commonName, X509* issuer, EVP_PKEY* issuerKey, bool ca) {
  CertPtr cert(X509_new());
  GEO_ENFORCE(cert != nullptr, "X509_new failed");
  X509_set_version(cert.get(), 2);
  unsigned char serial[16];
  GEO_ENFORCE(RAND_bytes(serial, sizeof serial) == 1, "RAND_bytes failed");
  serial[0] &= 0x7f;  // positive, as RFC 5280 (and Go) require
  BIGNUM* bn = BN_bin2bn(serial, sizeof serial, nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(commonName), -1, -1, 0);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(signer));
  if (ca) {
    addExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    addExtension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
    addExtension(cert.get(), signer, NID_subject_key_identifier, "hash");
  } else {
    addExtension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    addExtension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    addExtension(cert.get(), signer, NID_ext_key_usage, "serverAuth");
    addExtension(cert.get(), signer, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    addExtension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  }
  GEO_ENFORCE(X509_sign(cert.get(), issuerKey, EVP_sha256()) > 0, "X509_sign failed");
  return cert;
}

std::string toPem(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

std::string keyPem(EVP_PKEY* key) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  return pem;
}

std::string readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  GEO_ENFORCE(in.good(), "cannot read {}", path.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeFile(const std::filesystem::path& path, const std::string& text, bool secret) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    GEO_ENFORCE(out.good(), "cannot write {}", path.string());
    out << text;
    GEO_ENFORCE(out.good(), "cannot write {}", path.string());
  }
  if (secret) {
    std::filesystem::permissions(
        path, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
}

}  // namespace

TlsMaterial tlsMaterialIn(const std::string& dir) {
  const std::filesystem::path d(dir);
  const auto ca = d / "ca.pem", cert = d / "server.pem", key = d / "server-key.pem";
  if (!std::filesystem::exists(ca) || !std::filesystem::exists(cert) ||
      !std::filesystem::exists(key)) {
    std::filesystem::create_directories(d);
    TlsMaterial fresh = generateTlsMaterial();
    writeFile(ca, fresh.caPem, false);
    writeFile(cert, toPem(fresh.serverCert.get()), false);
    writeFile(key, keyPem(fresh.serverKey.get()), true);
    return fresh;
  }
  TlsMaterial loaded;
  loaded.caPem = readFile(ca);
  const std::string certText = readFile(cert), keyText = readFile(key);
  BIO* bio = BIO_new_mem_buf(certText.data(), static_cast<int>(certText.size()));
  loaded.serverCert.reset(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  GEO_ENFORCE(loaded.serverCert != nullptr, "{} holds no PEM certificate", cert.string());
  bio = BIO_new_mem_buf(keyText.data(), static_cast<int>(keyText.size()));
  loaded.serverKey.reset(PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr));
  BIO_free(bio);
  GEO_ENFORCE(loaded.serverKey != nullptr, "{} holds no PEM private key", key.string());
  return loaded;
}

TlsMaterial generateTlsMaterial() {
  KeyPtr caKey = newKey();
  CertPtr ca = newCert(caKey.get(), "geotrain-test-apiserver-ca", nullptr, caKey.get(), true);
  KeyPtr serverKey = newKey();
  CertPtr server =
      newCert(serverKey.get(), "geotrain-test-apiserver", ca.get(), caKey.get(), false);
  return TlsMaterial{toPem(ca.get()), std::move(server), std::move(serverKey)};
}

}  // namespace geo::testapi
