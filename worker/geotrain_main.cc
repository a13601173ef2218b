// `geotrain`: the user-facing command line (keygen, local, plan). Each subcommand is a thin wrapper
// over a library call that returns a Status; this file only parses arguments,
// prints results and turns Statuses into exit codes (0 ok, 1 failure, 2 usage
// error; `local` also 130 when interrupted). Nothing below calls exit(): main
// returns.

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "common/keys/keys.h"
#include "worker/local/cli.h"
#include "worker/local/launcher.h"
#include "worker/local/options.h"

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
  namespace gt = geo::keys;
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

int runPlanCommand(const geo::local::PlanOptions& options) {
  auto input = geo::local::makePlanInput(options);
  if (!input.ok()) {
    std::cerr << "geotrain plan: " << input.status().message() << "\n";
    return kExitFailure;
  }
  auto plan = geo::local::plan(*input);
  if (!plan.ok()) {
    std::cerr << "geotrain plan: " << plan.status().message() << "\n";
    return kExitFailure;
  }
  std::cout << geo::local::formatPlan(*input, *plan);
  return kExitOk;
}

int runLocalCommand(const geo::local::LocalOptions& options) {
  geo::local::LocalIo io{&std::cout, &std::cerr, ::isatty(STDOUT_FILENO) == 1};
  auto outcome = geo::local::runLocal(options, io);
  if (!outcome.ok()) {
    std::cerr << "geotrain local: " << outcome.status().message() << "\n";
    return kExitFailure;
  }
  return geo::local::exitCodeOf(*outcome);
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
  geo::local::LocalOptions localOptions;
  geo::local::PlanOptions planOptions;
  int result = kExitOk;
  addKeygen(app, keygenOptions, result);
  geo::local::addLocalCommand(app, localOptions, [&] { result = runLocalCommand(localOptions); });
  geo::local::addPlanCommand(app, planOptions, [&] { result = runPlanCommand(planOptions); });
  app.footer(
      "Run `geotrain <command> --help` for a command's options.\n"
      "Exit status: 0 on success, 1 when the command fails, 2 on a usage error.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    if (app.get_subcommands().empty()) {
      std::cerr
          << app.help()
          << "\ngeotrain: a command is required (e.g. `geotrain local` or `geotrain keygen`)\n";
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
