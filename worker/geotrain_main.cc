// `geotrain`: the user-facing command line. Each subcommand is a thin wrapper
// over a library call that returns a Status; this file only parses arguments,
// prints results and turns Statuses into exit codes (0 ok, 1 failure, 2 usage
// error). Nothing below calls exit(): main returns.

#include <CLI/CLI.hpp>

#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "worker/transport/keys.h"

#ifndef GEO_VERSION
#error "GEO_VERSION must be defined by the build (see worker/CMakeLists.txt)"
#endif

namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

struct KeygenOptions {
  std::string out = ".";
  std::string name = "worker";
};

int runKeygen(const KeygenOptions& options) {
  namespace gt = geo::transport;
  const gt::CurveKeyPair keys = gt::generateKeyPair();
  const geo::Status status = gt::writeKeyPair(keys, options.out, options.name);
  if (!status.ok()) {
    std::cerr << "geotrain keygen: " << status.message() << "\n";
    return kExitFailure;
  }
  const std::filesystem::path dir(options.out);
  std::cout << "wrote " << (dir / (options.name + ".key")).string()
            << " (secret key, mode 0600: keep it private)\n"
            << "wrote " << (dir / (options.name + ".pub")).string() << " (public key, mode 0644)\n"
            << "public key: " << keys.publicKey << "\n";
  return kExitOk;
}

void addKeygen(CLI::App& app, KeygenOptions& options, int& result) {
  CLI::App* keygen = app.add_subcommand(
      "keygen", "Generate a CurveZMQ keypair: <out>/<name>.key (secret) and <out>/<name>.pub");
  keygen
      ->add_option("--out,-o", options.out,
                   "Directory to write the key files into; created (mode 0700) if missing")
      ->capture_default_str();
  keygen
      ->add_option("--name,-n", options.name,
                   "Base name of the key files (a plain file name, no '/')")
      ->capture_default_str();
  keygen->footer(
      "Writes a fresh X25519 keypair from libsodium's CSPRNG, each key as 40 Z85\n"
      "characters and a newline: <out>/<name>.key holds the secret key (mode 0600)\n"
      "and stays with its worker; <out>/<name>.pub holds the public key (mode 0644),\n"
      "which goes into the job's list of admitted peers. Existing files are never\n"
      "overwritten: if either exists, nothing is written and the command fails.\n"
      "\n"
      "Example: geotrain keygen --out keys --name london-0\n"
      "Exit status: 0 when both files were written; 1 when nothing was written (a\n"
      "file exists, the directory cannot be written, ...); 2 on a usage error.");
  keygen->callback([&options, &result] { result = runKeygen(options); });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "geotrain trains one neural network across regions connected by slow, high-latency "
      "links. This is its command line.",
      "geotrain");
  app.set_version_flag("--version", std::string("geotrain ") + GEO_VERSION);
  app.require_subcommand(1);

  KeygenOptions keygenOptions;
  int result = kExitOk;
  addKeygen(app, keygenOptions, result);
  app.footer(
      "Run `geotrain <command> --help` for a command's options.\n"
      "Exit status: 0 on success, 1 when the command fails, 2 on a usage error.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    if (app.get_subcommands().empty()) {
      std::cerr << app.help() << "\ngeotrain: a command is required (e.g. `geotrain keygen`)\n";
      return kExitFailure;
    }
    app.exit(e);
    return kExitUsage;
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here as "errors" with exit code 0.
    const int code = app.exit(e);
    return code == 0 ? kExitOk : kExitUsage;
  } catch (const std::exception& e) {
    // A subcommand's callback runs inside parse(); library code reports
    // invariant violations (geo::Error) by throwing.
    std::cerr << "geotrain: " << e.what() << "\n";
    return kExitFailure;
  }
  return result;
}
