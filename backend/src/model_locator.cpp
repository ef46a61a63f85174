#include "edge/backend/model_locator.h"

#include <array>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

constexpr std::string_view fixture_name = "stories260K";
// The fixture folder holds the model in several formats; the GGUF has the tokenizer inside.
constexpr std::string_view fixture_file = "stories260K.gguf";

model_location located(std::filesystem::path path, const locate_options& options, std::string chosen_by) {
  std::string name = options.served_name ? *options.served_name : model_id_from_path(path);
  return {std::move(path), std::move(name), std::move(chosen_by)};
}

}  // namespace

std::string model_id_from_path(const std::filesystem::path& path) {
  std::filesystem::path p = path;
  if (!p.has_filename()) p = p.parent_path();  // "dir/" names the folder "dir"
  static constexpr std::array<std::string_view, 3> model_extensions = {".gguf", ".bin", ".safetensors"};
  const std::string extension = p.extension().string();
  for (auto known : model_extensions) {
    if (extension == known) return p.stem().string();
  }
  return p.filename().string();
}

result<model_location> locate_model(const locate_options& options) {
  std::error_code ec;
  if (options.requested) {
    if (!std::filesystem::exists(*options.requested, ec)) {
      return not_found(format("model path {} does not exist", options.requested->string()));
    }
    return located(*options.requested, options, "--model");
  }
  if (std::filesystem::exists(options.default_model, ec)) {
    return located(options.default_model, options, "models/default");
  }
  const std::filesystem::path fixture = options.test_models / fixture_name / fixture_file;
  if (std::filesystem::exists(fixture, ec)) {
    return located(fixture, options, "test fixture");
  }
  return not_found(format("no model given and none found: looked for --model/EDGE_MODEL, {} and {}",
                          options.default_model.string(), fixture.string()));
}

}  // namespace edge::backend
