// Throwaway certificates (vigil/transport/throwaway_certs.h), made with the OpenSSL API.
#include "vigil/transport/throwaway_certs.h"

#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <string>

namespace vigil::transport {


namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
struct X509Free {
  void operator()(X509* p) const { X509_free(p); }
};
struct X509ExtFree {
  void operator()(X509_EXTENSION* p) const { X509_EXTENSION_free(p); }
};
struct BioFree {
  void operator()(BIO* p) const { BIO_free_all(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;

Status OpenSslError(const std::string& step) {
  char buf[256] = "unknown error";
  if (const unsigned long e = ERR_get_error()) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return absl::InternalError(StrCat("test certs: ", step, ": ", buf));
}

// A certificate for `key` named CN=`cn`, signed by `issuer_key` (issuer == nullptr: self-signed) with
// the extensions given as openssl.cnf values (e.g. {NID_basic_constraints, "critical,CA:TRUE"}).
struct Ext {
  int nid;
  const char* value;
};
StatusOr<X509Ptr> MakeCert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key,
                                  std::initializer_list<Ext> exts) {
  X509Ptr cert(X509_new());
  if (!cert) return OpenSslError("X509_new");
  X509_set_version(cert.get(), X509_VERSION_3);
  // A random 64-bit serial: certificates of different runs never share issuer + serial.
  BIGNUM* serial = BN_new();
  BN_rand(serial, 64, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY);
  BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(cert.get()));
  BN_free(serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7L * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(cert.get(), issuer ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer ? issuer : cert.get(), cert.get(), nullptr, nullptr, 0);
  for (const Ext& e : exts) {
    std::unique_ptr<X509_EXTENSION, X509ExtFree> ext(X509V3_EXT_conf_nid(nullptr, &ctx, e.nid, e.value));
    if (!ext || X509_add_ext(cert.get(), ext.get(), -1) != 1) {
      return OpenSslError(StrCat("extension ", OBJ_nid2sn(e.nid), "=", e.value, " for ", cn));
    }
  }
  if (X509_sign(cert.get(), issuer_key ? issuer_key : key, EVP_sha256()) == 0) return OpenSslError("sign " + cn);
  return cert;
}

Status WriteCert(const std::string& path, X509* cert) {
  std::unique_ptr<BIO, BioFree> out(BIO_new_file(path.c_str(), "w"));
  if (!out || PEM_write_bio_X509(out.get(), cert) != 1) return OpenSslError("write " + path);
  return absl::OkStatus();
}

Status WriteKey(const std::string& path, EVP_PKEY* key) {
  std::unique_ptr<BIO, BioFree> out(BIO_new_file(path.c_str(), "w"));
  if (!out) return OpenSslError("write " + path);
  ::chmod(path.c_str(), 0600);
  if (PEM_write_bio_PrivateKey(out.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("write " + path);
  }
  return absl::OkStatus();
}

struct Issued {
  PkeyPtr key;
  X509Ptr cert;
};

StatusOr<Issued> Issue(const std::string& cn, const Issued* ca, std::initializer_list<Ext> exts) {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("EC P-256 key for " + cn);
  VIGIL_ASSIGN_OR_RETURN(X509Ptr cert, MakeCert(key.get(), cn, ca ? ca->cert.get() : nullptr,
                                                ca ? ca->key.get() : nullptr, exts));
  return Issued{std::move(key), std::move(cert)};
}

}  // namespace

StatusOr<ThrowawayCerts> MakeThrowawayCerts(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(StrCat("throwaway certificates: create ", dir, ": ", ec.message()));
  const auto ca_exts = {Ext{NID_basic_constraints, "critical,CA:TRUE"}, Ext{NID_key_usage, "critical,keyCertSign,cRLSign"},
                        Ext{NID_subject_key_identifier, "hash"}};
  VIGIL_ASSIGN_OR_RETURN(Issued ca, Issue("vigil test CA", nullptr, ca_exts));
  VIGIL_ASSIGN_OR_RETURN(Issued other_ca, Issue("vigil other CA", nullptr, ca_exts));
  VIGIL_ASSIGN_OR_RETURN(
      Issued server,
      Issue("localhost", &ca,
            {Ext{NID_basic_constraints, "critical,CA:FALSE"}, Ext{NID_key_usage, "critical,digitalSignature"},
             Ext{NID_ext_key_usage, "serverAuth"}, Ext{NID_subject_alt_name, "DNS:localhost,IP:127.0.0.1"},
             Ext{NID_authority_key_identifier, "keyid:always"}}));
  const auto client_exts = {Ext{NID_basic_constraints, "critical,CA:FALSE"},
                            Ext{NID_key_usage, "critical,digitalSignature"}, Ext{NID_ext_key_usage, "clientAuth"},
                            Ext{NID_authority_key_identifier, "keyid:always"}};
  VIGIL_ASSIGN_OR_RETURN(Issued client, Issue("vigil-test-edge", &ca, client_exts));
  VIGIL_ASSIGN_OR_RETURN(Issued other_client, Issue("vigil-test-edge", &other_ca, client_exts));

  const std::string base = dir.ends_with('/') ? dir : dir + "/";
  ThrowawayCerts t{base + "ca.pem",         base + "server.pem",       base + "server.key",
              base + "client.pem",     base + "client.key",       base + "other_ca.pem",
              base + "other_client.pem", base + "other_client.key"};
  VIGIL_RETURN_IF_ERROR(WriteCert(t.ca_cert, ca.cert.get()));
  VIGIL_RETURN_IF_ERROR(WriteCert(t.server_cert, server.cert.get()));
  VIGIL_RETURN_IF_ERROR(WriteKey(t.server_key, server.key.get()));
  VIGIL_RETURN_IF_ERROR(WriteCert(t.client_cert, client.cert.get()));
  VIGIL_RETURN_IF_ERROR(WriteKey(t.client_key, client.key.get()));
  VIGIL_RETURN_IF_ERROR(WriteCert(t.other_ca_cert, other_ca.cert.get()));
  VIGIL_RETURN_IF_ERROR(WriteCert(t.other_client_cert, other_client.cert.get()));
  VIGIL_RETURN_IF_ERROR(WriteKey(t.other_client_key, other_client.key.get()));
  return t;
}

}  // namespace vigil::transport
