// baton/cp/detail/front_end.hpp — what ring, Ulysses and hybrid attention do before their
// algorithms run: compile-time checks of the backend and mask, shape checks, and agreement
// among the ranks, so that bad input on any rank makes every rank throw the same cp_error
// before any data moves.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/hash.hpp>
#include <baton/core/tags.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/cross.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace baton::detail::cp {

enum operation_code : std::int64_t {
  op_ring_forward = 1, op_ring_backward, op_ulysses_forward, op_ulysses_backward, op_hybrid_forward,
  op_hybrid_backward, op_make_cp_mesh
};

template <class T>
call_descriptor describe(operation_code op, const local_shape& s, const sequence_sharding& sharding,
                         const kv_sharding& kv, bool cross, int world_size, int world_rank) {
  call_descriptor d;
  d.protocol = tags::cp::first;
  d.operation = op;
  d.rank = world_rank;
  d.values[call_field::batch] = s.batch;
  d.values[call_field::seq_local] = s.seq;
  d.values[call_field::seq_local_kv] = s.seq_kv;
  d.values[call_field::kv_seq_len] = kv.sharding.seq_len();
  d.values[call_field::kv_offset] = kv.position_offset;
  d.values[call_field::heads_q] = s.heads_q;
  d.values[call_field::heads_kv] = s.heads_kv;
  d.values[call_field::head_dim] = s.dim;
  d.values[call_field::seq_len] = sharding.seq_len();
  d.values[call_field::layout] = static_cast<std::int64_t>(sharding.layout());
  d.values[call_field::degree] = sharding.degree();
  d.values[call_field::inner_degree] = sharding.inner_degree();
  d.values[call_field::sharding_fingerprint] = sharding.fingerprint();
  // (self-attention: the keys' sharding is the queries', not hashed twice)
  d.values[call_field::kv_sharding_fingerprint] =
      cross ? kv.sharding.fingerprint() : d.values[call_field::sharding_fingerprint];
  d.values[call_field::element_size] = sizeof(T);
  d.values[call_field::lse_element_size] = sizeof(lse_t<T>);
  d.values[call_field::world_size] = world_size;
  return d;
}

// The first non-empty message, if any.
inline std::string first_problem(std::initializer_list<std::string> problems) {
  for (const std::string& p : problems)
    if (!p.empty()) return p;
  return {};
}

template <class T, class TI>
std::string check_forward_tensors(const local_shape& s, const tensor_view<TI, 4>& k, const tensor_view<TI, 4>& v,
                                  const tensor_view<T, 4>& out, const tensor_view<lse_t<T>, 3>& lse) {
  const std::array<std::int64_t, 4> qs{s.batch, s.seq, s.heads_q, s.dim}, kvs{s.batch, s.seq_kv, s.heads_kv, s.dim};
  return first_problem({expect(k, "k", kvs), expect(v, "v", kvs), expect(out, "out", qs),
                        expect(lse, "lse", std::array<std::int64_t, 3>{s.batch, s.heads_q, s.seq})});
}

template <class T>
std::string check_backward_tensors(const local_shape& s, const tensor_view<const T, 4>& k,
                                   const tensor_view<const T, 4>& v, const tensor_view<const T, 4>& out,
                                   const tensor_view<const lse_t<T>, 3>& lse, const tensor_view<const T, 4>& dout,
                                   const tensor_view<T, 4>& dq, const tensor_view<T, 4>& dk,
                                   const tensor_view<T, 4>& dv) {
  const std::array<std::int64_t, 4> qs{s.batch, s.seq, s.heads_q, s.dim}, kvs{s.batch, s.seq_kv, s.heads_kv, s.dim};
  return first_problem({expect(k, "k", kvs), expect(v, "v", kvs), expect(out, "out", qs),
                        expect(lse, "lse", std::array<std::int64_t, 3>{s.batch, s.heads_q, s.seq}),
                        expect(dout, "dout", qs), expect(dq, "dq", qs), expect(dk, "dk", kvs), expect(dv, "dv", kvs)});
}

// The element types of host memory: float, double, and storage types that convert
// explicitly to and from float (baton::bfloat16, baton::float16; accumulated in
// cp_accumulator_t<T>, fp32). A device space takes whatever its backend and kernels take.
template <class T>
inline constexpr bool host_storage_type_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (!std::is_arithmetic_v<T> && std::is_trivially_copyable_v<T> && std::is_constructible_v<T, float> &&
     std::is_constructible_v<float, T>);

template <class Backend, class T, class Memory = host_memory>
constexpr bool static_check_backend() {
  constexpr bool element_ok = host_storage_type_v<T> || Memory::location != cp_memory_location::host;
  static_assert(element_ok,
                "baton context parallelism: tensors must hold float, double or a 16-bit storage type converting to "
                "and from float (baton::bfloat16, baton::float16) (the element type of out / dq)");
  static_assert(attention_backend<std::remove_cvref_t<Backend>, T>,
                "baton context parallelism: the backend must model baton::attention_backend<B, T>: "
                "b.forward(q, k, v, mask, out, lse, params) and b.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, "
                "params) over tensor_view (see baton/attention/backend.hpp; baton::reference_attention is one)");
  return element_ok && attention_backend<std::remove_cvref_t<Backend>, T>;
}

template <class Mask>
constexpr bool static_check_mask() {
  static_assert(attention_mask<Mask>,
                "baton context parallelism: the mask must model baton::attention_mask: allowed(q_pos, k_pos) -> bool "
                "and classify(position_block, position_block) -> block_kind (see baton/attention/masks.hpp)");
  return attention_mask<Mask>;
}

// Both checks, reported together; the caller compiles its body only when they pass, so the
// static_assert messages are the whole error.
template <class Backend, class T, class Mask, class Memory = host_memory, class... Comms>
constexpr bool usable() {
  constexpr bool backend_ok = static_check_backend<Backend, T, Memory>();
  constexpr bool mask_ok = static_check_mask<Mask>();
  constexpr bool memory_ok = memory_matches_backend<Memory, std::remove_cvref_t<Backend>>() &&
                             (memory_matches_communicator<Memory, Comms>() && ...);
  return backend_ok && mask_ok && memory_ok;
}

// Empty when every tensor is memory the space works on (a device space checks that the
// pointers are device memory: host tensors given to a CUDA backend fail here, on every rank
// together, instead of crashing a kernel), else the first problem.
template <class Memory>
std::string check_memory(const Memory& mem, std::initializer_list<std::pair<const void*, const char*>> tensors) {
  for (const auto& [data, name] : tensors) {
    if (data == nullptr) continue;  // empty tensors (shape checks catch a null pointer elsewhere)
    std::string problem = mem.check_tensor(data, name);
    if (!problem.empty()) return problem;
  }
  return {};
}

// A fingerprint of a mask's identity and parameters, for the agreement: ranks that pass
// different masks would otherwise compute silently different attention. The built-in masks
// contribute their type and every parameter (a document_mask all its segment ids); any other
// mask its type and its answers on O(seq_len) probe pairs (each query against itself, its
// neighbours, the first and last key and a scattered key), or exactly what its
// `fingerprint()` member returns when it has one. Called only on a mask that passed
// check_mask (so every position in [0, seq_len) is valid for it).
using fingerprint_hasher = core::hasher;
template <class T>
inline constexpr bool is_block_mask_v = false;
template <class F>
inline constexpr bool is_block_mask_v<basic_block_mask<F>> = true;
template <class T>
inline constexpr bool is_padding_mask_v = false;
template <class M>
inline constexpr bool is_padding_mask_v<padding_mask<M>> = true;
template <class T>
inline constexpr bool is_intersection_v = false;
template <class A, class B>
inline constexpr bool is_intersection_v<mask_intersection<A, B>> = true;

// The positions a call's mask is asked about: queries [0, q_len), keys [k_begin, k_begin +
// k_len) (self-attention: both [0, seq_len)).
struct probe_space {
  std::int64_t q_len = 0, k_begin = 0, k_len = 0;
  // Key `i` of the space, i clamped into it (k_len > 0).
  std::int64_t key(std::int64_t i) const noexcept { return k_begin + std::clamp<std::int64_t>(i, 0, k_len - 1); }
};

template <class Mask>
void probe_mask(fingerprint_hasher& h, const Mask& mask, const probe_space& space) {
  std::uint64_t bits = 0;
  int used = 0;
  const auto put = [&](bool allowed) {
    bits = bits << 1 | (allowed ? 1u : 0u);
    if (++used == 64) {
      h.add(bits);
      bits = 0;
      used = 0;
    }
  };
  for (std::int64_t q = 0; q < space.q_len && space.k_len > 0; ++q) {
    const std::int64_t n = space.k_len;
    put(mask.allowed(q, space.key(q)));
    put(mask.allowed(q, space.key(0)));
    put(mask.allowed(q, space.key(n - 1)));
    put(mask.allowed(q, space.key(q > 0 ? q - 1 : q)));
    put(mask.allowed(q, space.key(q + 1 < n ? q + 1 : q)));
    put(mask.allowed(q, space.k_begin + (q * 7919 + 13) % n));
  }
  h.add(bits);
}

template <class Mask>
void fingerprint_mask(fingerprint_hasher& h, const Mask& mask, const probe_space& space) {
  h.add(std::string_view(typeid(Mask).name()));
  if constexpr (requires { { mask.fingerprint() } -> std::convertible_to<std::uint64_t>; }) {
    h.add(static_cast<std::uint64_t>(mask.fingerprint()));
  } else if constexpr (is_intersection_v<Mask>) {
    fingerprint_mask(h, mask.first, space);
    fingerprint_mask(h, mask.second, space);
  } else if constexpr (is_padding_mask_v<Mask>) {
    h.add(static_cast<std::uint64_t>(mask.length()));
    h.add(static_cast<std::uint64_t>(mask.k_length()));
    probe_space real = space;  // the inner mask is never asked about padding
    real.q_len = std::min(space.q_len, mask.length());
    real.k_len = std::clamp<std::int64_t>(mask.k_length() - space.k_begin, 0, space.k_len);
    fingerprint_mask(h, mask.inner(), real);
  } else if constexpr (is_block_mask_v<Mask>) {
    h.add(static_cast<std::uint64_t>(mask.q_length()));
    h.add(static_cast<std::uint64_t>(mask.k_length()));
    h.add(static_cast<std::uint64_t>(mask.block_size()));
    for (std::int64_t i = 0; i < mask.q_blocks(); ++i)
      for (std::int64_t j = 0; j < mask.k_blocks(); ++j) h.add(static_cast<std::uint64_t>(mask.cell(i, j)));
    probe_mask(h, mask, space);
  } else {
    probe_mask(h, mask, space);
  }
}

template <class Mask>
std::int64_t mask_fingerprint(const Mask& mask, const probe_space& space) {
  fingerprint_hasher h;
  fingerprint_mask(h, mask, space);
  return h.value();
}
template <class Mask>
std::int64_t mask_fingerprint(const Mask& mask, std::int64_t seq_len) {
  return mask_fingerprint(mask, probe_space{seq_len, 0, seq_len});
}

// The problem, if any, with pairing the queries' sharding with the keys' (cross-attention):
// both must cut over the same ranks, and key positions start at 0 or later.
inline std::string pairing_problem(const sequence_sharding& q, const kv_sharding& kv) {
  if (kv.sharding.degree() != q.degree() || kv.sharding.inner_degree() != q.inner_degree())
    return "the key/value sharding is " + std::to_string(kv.sharding.degree()) + " x " +
           std::to_string(kv.sharding.inner_degree()) + " (degree x inner degree) but the query sharding " +
           std::to_string(q.degree()) + " x " + std::to_string(q.inner_degree()) +
           "; cross-attention shards queries and keys over the same ranks: build both with the same degrees "
           "(the lengths and layouts may differ)";
  if (kv.position_offset < 0)
    return "the key/value position offset is " + std::to_string(kv.position_offset) +
           "; it must be >= 0 (masks see key j at position offset + j)";
  return {};
}

// The problem, if any, with the sharding of a class that shards over one group of `size`
// ranks (ring_attention: the ring; ulysses_attention: the all-to-all group). The words name
// the class's rule, its communicator and that communicator's size.
inline std::string one_group_problem(const sequence_sharding& sharding, int size, std::string_view shards_over,
                                     std::string_view communicator, std::string_view size_call) {
  if (sharding.inner_degree() != 1)
    return "the sequence_sharding has inner degree " + std::to_string(sharding.inner_degree()) + "; " +
           std::string(shards_over) + " (use hybrid_attention for Ulysses x ring)";
  if (sharding.degree() != size)
    return "the sequence_sharding spreads the sequence over " + std::to_string(sharding.degree()) + " ranks but " +
           std::string(communicator) + " has " + std::to_string(size) + "; build the sharding with degree = " +
           std::string(size_call);
  return {};
}

// The problem with a softmax scale, if any (the backends' own rule, checked before any data
// moves so that a bad scale on one rank stops every rank together).
inline std::string check_scale(double scale) {
  if (!(scale >= 0) || std::isinf(scale))
    return "softmax_scale is " + scale_text(scale_bits(scale)) +
           "; it must be positive and finite (0 selects 1/sqrt(head dim))";
  return {};
}

// Records this rank's problem (if any) in its descriptor, with the fingerprint of its mask
// and its softmax scale (0 resolved to 1/sqrt(head dim)), has `gather` collect every rank's
// descriptor, and then either every rank returns or every rank throws the same cp_error
// (after `settle`: see agree_settle_or_throw).
template <class T, class Mask, class Gather, class Settle>
void agree_on_call(const std::string& who, operation_code op, const local_shape& s, const sequence_sharding& sharding,
                   const kv_sharding& kv, bool cross, int world_size, int world_rank, std::string problem,
                   const Mask& mask, double scale, Gather&& gather, Settle&& settle) {
  call_descriptor mine = describe<T>(op, s, sharding, kv, cross, world_size, world_rank);
  if (problem.empty()) problem = check_scale(scale);
  if (!problem.empty()) {
    mine.fail(1, "rank " + std::to_string(world_rank) + ": " + problem);
  } else {
    mine.values[call_field::mask_fingerprint] =
        mask_fingerprint(mask, probe_space{sharding.seq_len(), kv.position_offset, kv.sharding.seq_len()});
    mine.values[call_field::softmax_scale] =
        scale_bits(scale == 0 ? (s.dim > 0 ? 1.0 / std::sqrt(static_cast<double>(s.dim)) : 1.0) : scale);
  }
  const std::vector<call_descriptor> all = gather(mine);
  agree_settle_or_throw(who, all, settle);
}

// The public forward and backward of a context-parallel attention class (CRTP): checks,
// agreement, then the class's algorithm. Derived provides, as members this base may call
// (befriend it):
//   static constexpr const char* name;                     ("baton::ring_attention")
//   static constexpr operation_code forward_op, backward_op;
//   const sequence_sharding& sharding() const; int shard_index() const; int world_size() const;
//   const kv_sharding& kv() const;          (the keys' sharding: the queries' for self-attention)
//   bool is_cross() const;                  (built with a kv_sharding)
//   std::string topology_problem() const;   (the sharding does not fit the communicators, or "")
//   std::string heads_problem(const local_shape&) const;  (the heads cannot be split, or "")
//   std::vector<call_descriptor> gather(const call_descriptor& mine);  (comm/agree.hpp)
//   void settle();                                          (before every rank throws the verdict)
//   G geometry(const local_shape&) const;   (what the algorithm needs once the ranks agree)
//   template <class T, class Mask> void run_forward(const G&, q, k, v, mask, out, lse, double scale);
//   template <class T, class Mask> void run_backward(const G&, q, k, v, out, lse, dout, mask, dq, dk,
//                                                    dv, double scale);
//   Memory& memory();  (the memory space its buffers and copies use, cp/memory.hpp)
// (ulysses_attention and hybrid_attention take run_forward and run_backward from their base
// ulysses_stage, ulysses.hpp.)
// Memory and Comms (the communicators the algorithm uses) are checked against each other and
// against the backend at compile time; the tensors against Memory at run time (agreed).
template <class Derived, class Backend, class Memory = host_memory, class... Comms>
class front_end {
 public:
  /// Attention of this rank's queries over the whole sequence: out and lse for its shard.
  template <class T, class Mask>
  void forward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
               std::type_identity_t<tensor_view<const T, 4>> v, const Mask& mask, tensor_view<T, 4> out,
               std::type_identity_t<tensor_view<lse_t<T>, 3>> lse, const cp_params& params = {}) {
    if constexpr (usable<Backend, T, Mask, Memory, Comms...>()) {
      const local_shape s = shape(q, k);
      const auto agreed = agree<T>(
          false, s, mask, params.softmax_scale, params.caller_problem,
          first_problem({check_forward_tensors<T>(s, k, v, out, lse),
                         check_memory(self().memory(),
                                      {{q.data, "q"}, {k.data, "k"}, {v.data, "v"}, {out.data, "out"}, {lse.data, "lse"}})}));
      self().template run_forward<T>(agreed, q, k, v, mask, out, lse, params.softmax_scale);
      self().memory().synchronize();  // the results are complete when forward returns
    }
  }

  /// The gradients: dq for this rank's queries, dk and dv for its own keys and values.
  template <class T, class Mask>
  void backward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
                std::type_identity_t<tensor_view<const T, 4>> v, std::type_identity_t<tensor_view<const T, 4>> out,
                std::type_identity_t<tensor_view<const lse_t<T>, 3>> lse,
                std::type_identity_t<tensor_view<const T, 4>> dout, const Mask& mask, tensor_view<T, 4> dq,
                std::type_identity_t<tensor_view<T, 4>> dk, std::type_identity_t<tensor_view<T, 4>> dv,
                const cp_params& params = {}) {
    if constexpr (usable<Backend, T, Mask, Memory, Comms...>()) {
      const local_shape s = shape(q, k);
      const auto agreed = agree<T>(
          true, s, mask, params.softmax_scale, params.caller_problem,
          first_problem({check_backward_tensors<T>(s, k, v, out, lse, dout, dq, dk, dv),
                         check_memory(self().memory(), {{q.data, "q"},
                                                        {k.data, "k"},
                                                        {v.data, "v"},
                                                        {out.data, "out"},
                                                        {lse.data, "lse"},
                                                        {dout.data, "dout"},
                                                        {dq.data, "dq"},
                                                        {dk.data, "dk"},
                                                        {dv.data, "dv"}})}));
      self().template run_backward<T>(agreed, q, k, v, out, lse, dout, mask, dq, dk, dv, params.softmax_scale);
      self().memory().synchronize();
    }
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  // Cross-attention: the keys have their own sharding (built with a kv_sharding).
  bool cross() noexcept { return self().is_cross(); }
  // The call's shape. In self-attention k, v, dk, dv must have the queries' length, so a
  // key tensor of another length is named by the tensor checks.
  template <class TQ, class TK>
  local_shape shape(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k) {
    local_shape s = shape_of(q, k);
    if (!cross()) s.seq_kv = s.seq;
    return s;
  }

  // Every problem this rank sees in its call (the caller's first), agreed among the ranks;
  // then what the algorithm needs.
  template <class T, class Mask>
  auto agree(bool backward, const local_shape& s, const Mask& mask, double scale, const std::string& caller_problem,
             const std::string& tensor_problem) {
    const sequence_sharding& sharding = self().sharding();
    const kv_sharding& kv = self().kv();
    std::string problem = first_problem({caller_problem, pairing_problem(sharding, kv), self().topology_problem()});
    if (problem.empty())  // (local_len needs the rank to be within both shardings)
      problem = first_problem({check_local(s, sharding.local_len(self().shard_index()),
                                           kv.sharding.local_len(self().shard_index()), cross()),
                               tensor_problem, self().heads_problem(s),
                               check_mask(mask, sharding.seq_len(), kv.position_offset, kv.sharding.seq_len())});
    agree_on_call<T>(std::string(Derived::name) + (backward ? "::backward" : "::forward"),
                     backward ? Derived::backward_op : Derived::forward_op, s, sharding, kv, cross(), self().world_size(),
                     self().shard_index(), problem, mask, scale,
                     [&](const call_descriptor& mine) { return self().gather(mine); }, [&] { self().settle(); });
    return self().geometry(s);
  }
};

}  // namespace baton::detail::cp
