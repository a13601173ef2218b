#pragma once
// A throw-away certificate authority and server certificate, generated at
// start-up, so TLS clients (kubectl, helm, libcurl) verify the test
// apiserver exactly like a real cluster's: against CA data in a kubeconfig.

#include <openssl/evp.h>
#include <openssl/x509.h>

#include <memory>
#include <string>

namespace geo::testapi {

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

struct TlsMaterial {
  std::string caPem;  // the CA certificate clients trust
  std::unique_ptr<X509, X509Deleter> serverCert;
  std::unique_ptr<EVP_PKEY, PkeyDeleter> serverKey;
};

// A P-256 CA and a server certificate it signs for 127.0.0.1 and localhost
// (subjectAltName; Go ignores the common name). Valid from an hour ago for
// a year. Throws geo::Error if OpenSSL fails.
TlsMaterial generateTlsMaterial();

// The material in `dir` (ca.pem, server.pem, server-key.pem) if all three
// are there, else new material written there (the key readable by its
// owner only): a test apiserver restarted with the same directory presents
// the certificate its clients' kubeconfigs already trust. Throws geo::Error
// naming the file when one cannot be read, parsed or written.
TlsMaterial tlsMaterialIn(const std::string& dir);

}  // namespace geo::testapi
