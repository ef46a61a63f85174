#include "edge/backend/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "edge/backend/model/formats.h"

namespace edge::backend {

namespace {

double yarn_mscale(double factor, double mscale) { return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0; }

}  // namespace

double rope_scaling_yarn::rotary_factor() const {
  if (attention_factor) return *attention_factor;
  if (mscale != 0.0 && mscale_all_dim != 0.0) return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  return yarn_mscale(factor, 1.0);
}

double rope_scaling_yarn::softmax_factor() const {
  if (mscale_all_dim == 0.0) return 1.0;
  const double m = yarn_mscale(factor, mscale_all_dim);
  return m * m;
}

bool moe_config::sparse(std::int64_t layer) const {
  if (num_experts == 0 || layer < first_dense_layers) return false;
  if (std::find(dense_layers.begin(), dense_layers.end(), layer) != dense_layers.end()) return false;
  return sparse_step > 0 && (layer + 1) % sparse_step == 0;
}

std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  text += ']';
  return text;
}

}  // namespace edge::backend
