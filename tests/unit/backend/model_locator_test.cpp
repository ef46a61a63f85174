#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "edge/backend/model_locator.h"

namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    path = fs::temp_directory_path() / ("edge_locator_test_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("model ids come from the file or folder name") {
  CHECK(edge::backend::model_id_from_path("/m/stories260K.gguf") == "stories260K");
  CHECK(edge::backend::model_id_from_path("/m/stories260K.bin") == "stories260K");
  CHECK(edge::backend::model_id_from_path("/m/Llama-3-8B/") == "Llama-3-8B");
  CHECK(edge::backend::model_id_from_path("/m/Qwen2.5-0.5B") == "Qwen2.5-0.5B");
  CHECK(edge::backend::model_id_from_path("weights.pt") == "weights.pt");
}

TEST_CASE("the default model is chosen in the documented order") {
  temp_dir dir;
  edge::backend::locate_options options;
  options.default_model = dir.path / "models" / "default";
  options.test_models = dir.path / "shared";

  SUBCASE("nothing anywhere is not_found and says where it looked") {
    auto found = edge::backend::locate_model(options);
    REQUIRE_FALSE(found.ok());
    CHECK(found.error().code() == edge::status_code::not_found);
    CHECK(found.error().message().find((dir.path / "shared" / "stories260K").string()) != std::string::npos);
  }
  SUBCASE("the test fixture comes last") {
    fs::create_directories(options.test_models / "stories260K");
    std::ofstream(options.test_models / "stories260K" / "stories260K.gguf") << "x";
    auto found = edge::backend::locate_model(options);
    REQUIRE(found.ok());
    CHECK(found->served_name == "stories260K");
    CHECK(found->chosen_by == "test fixture");
    CHECK(found->path == options.test_models / "stories260K" / "stories260K.gguf");
  }
  SUBCASE("models/default beats the fixture") {
    fs::create_directories(options.test_models / "stories260K");
    fs::create_directories(options.default_model.parent_path());
    std::ofstream(options.default_model) << "x";
    auto found = edge::backend::locate_model(options);
    REQUIRE(found.ok());
    CHECK(found->path == options.default_model);
    CHECK(found->chosen_by == "models/default");
  }
  SUBCASE("--model beats everything, and a missing one is an error") {
    fs::create_directories(options.test_models / "stories260K");
    options.requested = dir.path / "mine.gguf";
    auto missing = edge::backend::locate_model(options);
    REQUIRE_FALSE(missing.ok());
    CHECK(missing.error().message() == "model path " + (dir.path / "mine.gguf").string() + " does not exist");
    std::ofstream(*options.requested) << "x";
    options.served_name = "my-model";
    auto found = edge::backend::locate_model(options);
    REQUIRE(found.ok());
    CHECK(found->served_name == "my-model");
    CHECK(found->chosen_by == "--model");
  }
}
