#include "nn/container.h"

#include <string>

namespace tessel::nn {

ModuleList::ModuleList(const std::vector<std::shared_ptr<Module>>& modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

void ModuleList::push_back(std::shared_ptr<Module> m) {
  add_child(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

const std::shared_ptr<Module>& ModuleList::operator[](size_t i) const {
  TESSEL_CHECK(i < items_.size(), "ModuleList", "index {} out of range (size {})", i, items_.size());
  return items_[i];
}

void ModuleList::type_error(size_t i) const {
  TESSEL_FAIL("ModuleList", "module {} is a {}, not the requested type", i, items_[i]->type_name());
}

Sequential::Sequential(const std::vector<std::shared_ptr<UnaryModule>>& modules) : UnaryModule("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<UnaryModule> m) {
  add_child(std::to_string(items_.size()), m);
  items_.push_back(std::move(m));
}

const std::shared_ptr<UnaryModule>& Sequential::operator[](size_t i) const {
  TESSEL_CHECK(i < items_.size(), "Sequential", "index {} out of range (size {})", i, items_.size());
  return items_[i];
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& m : items_) y = (*m)(y);
  return y;
}

}  // namespace tessel::nn
