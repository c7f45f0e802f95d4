// baton/train/checkpoint_state.hpp — what a checkpoint holds, as any trainer describes it (no
// file format here; baton/train/json/checkpoint.hpp writes and reads it): each tensor a rank
// saves from and loads into, by its global name; the step, the data position, every random
// state; the settings a checkpoint must match to be loaded. Plus the collective question a
// signal handler's flag needs answered between steps (any_rank).
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/float16.hpp>
#include <baton/nn/optim.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/traits.hpp>
#include <baton/train/checkpoint_error.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::train {

/// The element types of the safetensors format, by their names there.
enum class tensor_dtype { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64 };

inline constexpr std::array<std::pair<tensor_dtype, std::string_view>, 13> tensor_dtype_names{{
    {tensor_dtype::BOOL, "BOOL"}, {tensor_dtype::U8, "U8"},   {tensor_dtype::I8, "I8"},   {tensor_dtype::I16, "I16"},
    {tensor_dtype::U16, "U16"},   {tensor_dtype::F16, "F16"}, {tensor_dtype::BF16, "BF16"}, {tensor_dtype::I32, "I32"},
    {tensor_dtype::U32, "U32"},   {tensor_dtype::F32, "F32"}, {tensor_dtype::F64, "F64"}, {tensor_dtype::I64, "I64"},
    {tensor_dtype::U64, "U64"},
}};

constexpr std::string_view to_string(tensor_dtype t) noexcept {
  for (const auto& [type, name] : tensor_dtype_names)
    if (type == t) return name;
  return "?";
}

constexpr std::size_t element_bytes(tensor_dtype t) noexcept {
  switch (t) {
    case tensor_dtype::BOOL:
    case tensor_dtype::U8:
    case tensor_dtype::I8: return 1;
    case tensor_dtype::I16:
    case tensor_dtype::U16:
    case tensor_dtype::F16:
    case tensor_dtype::BF16: return 2;
    case tensor_dtype::I32:
    case tensor_dtype::U32:
    case tensor_dtype::F32: return 4;
    case tensor_dtype::F64:
    case tensor_dtype::I64:
    case tensor_dtype::U64: return 8;
  }
  return 0;
}

constexpr std::optional<tensor_dtype> tensor_dtype_from(std::string_view name) noexcept {
  for (const auto& [type, n] : tensor_dtype_names)
    if (n == name) return type;
  return std::nullopt;
}

/// The safetensors dtype of a C++ element type (float: F32, double: F64, std::int64_t: I64, ...).
template <class T>
constexpr tensor_dtype dtype_of() noexcept {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>) return tensor_dtype::F32;
  else if constexpr (std::is_same_v<U, double>) return tensor_dtype::F64;
  else if constexpr (std::is_same_v<U, bfloat16>) return tensor_dtype::BF16;
  else if constexpr (std::is_same_v<U, float16>) return tensor_dtype::F16;
  else if constexpr (std::is_same_v<U, bool>) return tensor_dtype::BOOL;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 8) return tensor_dtype::I64;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 4) return tensor_dtype::I32;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 2) return tensor_dtype::I16;
  else if constexpr (std::is_integral_v<U> && std::is_signed_v<U> && sizeof(U) == 1) return tensor_dtype::I8;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 8) return tensor_dtype::U64;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 4) return tensor_dtype::U32;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 2) return tensor_dtype::U16;
  else if constexpr (std::is_integral_v<U> && sizeof(U) == 1) return tensor_dtype::U8;
  else static_assert(sizeof(U) == 0, "baton::train::dtype_of<T>: T has no safetensors dtype (use float, double, "
                                     "bfloat16, float16, bool or a fixed-width integer)");
}

/// Settings as text, in the order a reader compares them: ("layers", "8"), ("d_model", "64"), ...
using checkpoint_settings = std::vector<std::pair<std::string, std::string>>;

/// Everything a checkpoint records besides its tensors (its manifest).
struct checkpoint_record {
  /// Optimizer steps taken (AdamW's bias corrections continue from it).
  std::int64_t step = 0;
  /// Where the data continue, in the trainer's own unit (baton's byte_corpus: the next batch
  /// number, which is the step count unless the program skipped batches).
  std::int64_t data_position = 0;
  /// Every random generator of the run, as text (random_state_text); keys are the program's.
  std::map<std::string, std::string> random_states{};
  /// Free text the program keeps with the checkpoint (the data file, the command line, ...).
  std::map<std::string, std::string> metadata{};
  /// What must match to load: the model's shape and element type. The first difference is
  /// named and the load refused.
  checkpoint_settings model{};
  /// How it was trained (learning rate, batch, ...): recorded, and compared by the caller,
  /// which may warn (a resumed run may change them on purpose).
  checkpoint_settings training{};
  /// How it was spread over the ranks when written (any other mesh loads it).
  checkpoint_settings mesh{};
};

/// One tensor of a rank: saved from `bytes`, loaded into them. Its name is global (the same on
/// every mesh: "layers.3.attention.wq.weight"), so any rank that holds it finds it again whatever
/// rank wrote it. `file` groups tensors into files ("model", "optimizer": the files
/// model-<rank>.safetensors and optimizer-<rank>.safetensors).
struct checkpoint_tensor {
  std::string name;
  std::string file = "model";
  tensor_dtype dtype = tensor_dtype::F32;
  std::vector<std::int64_t> shape{};
  std::span<std::byte> bytes{};
};

/// Every parameter of `list` under its name, in the file group `file`.
template <class Tensor>
void add_parameters(std::vector<checkpoint_tensor>& out, const std::vector<nn::named_parameter<Tensor>>& list,
                    const std::string& file = "model") {
  using traits = payload_traits<Tensor>;
  for (const auto& p : list) {
    const auto& shape = traits::shape(p.parameter->value);
    out.push_back({p.name, file, dtype_of<typename traits::value_type>(),
                   std::vector<std::int64_t>(shape.begin(), shape.end()), traits::mutable_bytes(p.parameter->value)});
  }
}

/// AdamW's moments, "<parameter>.exp_avg" and "<parameter>.exp_avg_sq", in the file group
/// `file`. Its step count is the checkpoint's step (checkpoint_record::step; set_steps).
template <class Tensor>
void add_adamw_state(std::vector<checkpoint_tensor>& out, nn::basic_adamw<Tensor>& optimizer,
                     const std::string& file = "optimizer") {
  using traits = payload_traits<Tensor>;
  const auto& list = optimizer.parameters();
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto& shape = traits::shape(list[i].parameter->value);
    const std::vector<std::int64_t> dims(shape.begin(), shape.end());
    const tensor_dtype dtype = dtype_of<typename traits::value_type>();
    out.push_back({list[i].name + ".exp_avg", file, dtype, dims, std::as_writable_bytes(optimizer.first_moment(i))});
    out.push_back({list[i].name + ".exp_avg_sq", file, dtype, dims, std::as_writable_bytes(optimizer.second_moment(i))});
  }
}

/// The state of a random engine as text (what `os << engine` writes: the standard library's
/// engines all have it), for checkpoint_record::random_states.
template <class Engine>
std::string random_state_text(const Engine& engine) {
  std::ostringstream s;
  s << engine;
  return s.str();
}

/// Restores a random engine from random_state_text's text; throws checkpoint_error (damaged)
/// naming `name` when the text is not a state of this engine.
template <class Engine>
void restore_random_state(const std::string& text, Engine& engine, const std::string& name = "random state") {
  std::istringstream s(text);
  Engine restored;
  s >> restored;
  if (!s) throw checkpoint_error(checkpoint_error::kind::damaged, "the checkpoint's " + name + " is not a state of this engine");
  engine = restored;
}

/// Whether `mine` is set on any rank of `world` (collective: every rank calls it, between the
/// same two steps). A signal handler may only set a flag; asking this after each step turns one
/// process's flag (MPI) or the one process's flag seen at different moments by its rank threads
/// into one decision that every rank takes at the same step: then all save together.
template <class Comm>
bool any_rank(Comm& world, bool mine) {
  static_assert(all_reduce_communicator<Comm>, "baton::train::any_rank<Comm>: Comm must all-reduce (local_communicator and "
                                               "mpi_communicator do)");
  std::int64_t v = mine ? 1 : 0;
  world.all_reduce(std::span<std::int64_t>(&v, 1), reduce_op::max);
  return v != 0;
}

}  // namespace baton::train
