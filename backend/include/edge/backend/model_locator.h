// Which model to serve when the user names none, in the order of DESIGN.md:
//
//   1. --model / EDGE_MODEL (resolved by the configuration layer before this is called)
//   2. models/default: a file or folder the user put there
//   3. the stories260K fixture under ${EDGE_TEST_MODELS:-../shared/models}
//
// The served model id is the folder name, or the file name without a model-format extension
// (.gguf, .bin, .safetensors), unless --served-model-name says otherwise.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "edge/common/status.h"

namespace edge::backend {

struct model_location {
  std::filesystem::path path;
  std::string served_name;
  std::string chosen_by;  // "--model", "models/default", "test fixture"
};

struct locate_options {
  std::optional<std::filesystem::path> requested;   // --model / EDGE_MODEL
  std::optional<std::string> served_name;           // --served-model-name
  std::filesystem::path default_model = "models/default";
  std::filesystem::path test_models = "../shared/models";  // EDGE_TEST_MODELS
};

// not_found when a requested path does not exist, or when no candidate exists at all (the
// message lists every place that was looked at).
result<model_location> locate_model(const locate_options& options);

// "stories260K" for ".../stories260K.gguf" or ".../stories260K/".
std::string model_id_from_path(const std::filesystem::path& path);

}  // namespace edge::backend
