// The memory-space boundary of the context-parallel layer (cp/memory.hpp), on the CPU.
//
// A fake device: memory the host code cannot touch. Its allocations are poisoned (0xFF
// bytes, a NaN in float and double) and handed out as pointers with the top bit set, which
// are non-canonical on x86-64 and AArch64: any load or store through one from code that did
// not translate it faults. Only three things translate, after checking that the whole range
// lies inside one live allocation — the fake memory space (copies, fills, accumulations,
// merges: it forwards to host_memory on the translated views), the fake backend (reference
// attention on translated views) and the fake communicator (the local world on translated
// spans). So ring, Ulysses and hybrid attention run here exactly as they would on a GPU:
// every buffer they use must come from the memory space, every byte they move must move
// through it, the agreement's host descriptors must be staged, a value read before it was
// written shows up as NaN, and a buffer handed to the communicator before synchronize()
// (while "device" work is still pending) is an error.
//
// Results must equal the host-memory run bit for bit (same operations, same order) and the
// unsharded reference within cp_test::tolerance<T>() (the parity tests' bound).
#include "cp_test_support.hpp"

#include <baton/cp/memory.hpp>

#include "catch.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using baton::tensor_view;

// The fake device's memory: one arena for all ranks (threads).
class fake_device {
 public:
  static constexpr std::uintptr_t tag = std::uintptr_t{1} << 63;

  void* allocate(std::size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto block = std::make_unique<std::byte[]>(bytes == 0 ? 1 : bytes);
    std::memset(block.get(), 0xFF, bytes);  // poison: NaN in every float and double
    const auto real = reinterpret_cast<std::uintptr_t>(block.get());
    blocks_.emplace(real | tag, entry{std::move(block), bytes});
    ++allocations_;
    return reinterpret_cast<void*>(real | tag);
  }
  void free(void* fake) noexcept {
    const std::lock_guard<std::mutex> lock(mutex_);
    blocks_.erase(reinterpret_cast<std::uintptr_t>(fake));
  }
  // The host address of [fake, fake + bytes), which must lie in one live allocation.
  void* real(const void* fake, std::size_t bytes, const char* who) const {
    const auto p = reinterpret_cast<std::uintptr_t>(fake);
    if (bytes == 0) return nullptr;
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if ((p & tag) == 0 || it == blocks_.begin())
      throw std::logic_error(std::string(who) + ": a host pointer reached the fake device");
    --it;
    if (p + bytes > it->first + it->second.bytes)
      throw std::logic_error(std::string(who) + ": a range runs past its fake device allocation");
    return reinterpret_cast<void*>(p & ~tag);
  }
  bool owns(const void* fake) const {
    const auto p = reinterpret_cast<std::uintptr_t>(fake);
    const std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.upper_bound(p);
    if ((p & tag) == 0 || it == blocks_.begin()) return false;
    --it;
    return p < it->first + std::max<std::size_t>(it->second.bytes, 1);
  }
  std::size_t live() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return blocks_.size();
  }

  template <class T>
  T* upload(const std::vector<T>& host) {
    auto* p = static_cast<T*>(allocate(host.size() * sizeof(T)));
    if (!host.empty()) std::memcpy(real(p, host.size() * sizeof(T), "upload"), host.data(), host.size() * sizeof(T));
    return p;
  }
  template <class T>
  std::vector<T> download(const T* p, std::size_t n) const {
    std::vector<T> host(n);
    if (n != 0) std::memcpy(host.data(), real(p, n * sizeof(T), "download"), n * sizeof(T));
    return host;
  }

 private:
  struct entry {
    std::unique_ptr<std::byte[]> block;
    std::size_t bytes = 0;
  };
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, entry> blocks_;
  std::atomic<std::size_t> allocations_{0};
};

// The elements a strided view spans (strides are non-negative in the CP layer).
template <class T>
std::size_t span_of(const std::array<std::int64_t, 4>& ext, const std::array<std::int64_t, 4>& str) {
  std::int64_t last = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    if (ext[i] == 0) return 0;
    last += (ext[i] - 1) * str[i];
  }
  return static_cast<std::size_t>(last + 1);
}

template <class T>
tensor_view<T, 4> real_view(const fake_device& dev, const tensor_view<T, 4>& v, const char* who) {
  tensor_view<T, 4> r = v;
  r.data = static_cast<T*>(dev.real(v.data, span_of<T>(v.extents(), v.strides()) * sizeof(T), who));
  return r;
}

template <class T, std::size_t N>
baton::tensor_view<T, N> real_tensor(const fake_device& dev, baton::tensor_view<T, N> v, const char* who) {
  std::int64_t last = 0;
  bool empty = false;
  for (std::size_t i = 0; i < N; ++i) {
    if (v.extent(i) == 0) empty = true;
    last += (v.extent(i) - 1) * v.stride(i);
  }
  v.data = empty ? nullptr : static_cast<T*>(dev.real(v.data, static_cast<std::size_t>(last + 1) * sizeof(T), who));
  return v;
}

// Per rank: what the "stream" has pending and what was called.
struct rank_state {
  fake_device* dev = nullptr;
  bool pending = false;  // work issued since the last synchronize() (or order_before)
  int copies = 0, fills = 0, accumulates = 0, merges = 0, syncs = 0, staged = 0, transfers = 0, backend_calls = 0;
  int orders_before = 0, orders_after = 0;  // the stream-ordered hooks (ordered_fake_memory)
};

// The memory space: host_memory's loops on translated views.
class fake_memory {
 public:
  static constexpr baton::cp_memory_location location = baton::cp_memory_location::host;

  template <class T>
  class buffer {
   public:
    buffer() = default;
    buffer(fake_device* dev, std::size_t n) : dev_(dev), data_(static_cast<T*>(dev->allocate(n * sizeof(T)))), size_(n) {}
    buffer(buffer&& o) noexcept
        : dev_(std::exchange(o.dev_, nullptr)), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
    buffer& operator=(buffer&& o) noexcept {
      if (this != &o) {
        reset();
        dev_ = std::exchange(o.dev_, nullptr);
        data_ = std::exchange(o.data_, nullptr);
        size_ = std::exchange(o.size_, 0);
      }
      return *this;
    }
    buffer(const buffer&) = delete;
    buffer& operator=(const buffer&) = delete;
    ~buffer() { reset(); }
    T* data() const noexcept { return data_; }
    std::size_t size() const noexcept { return size_; }

   private:
    void reset() noexcept {
      if (dev_ != nullptr && data_ != nullptr) dev_->free(data_);
      data_ = nullptr;
    }
    fake_device* dev_ = nullptr;
    T* data_ = nullptr;
    std::size_t size_ = 0;
  };

  explicit fake_memory(std::shared_ptr<rank_state> state) : state_(std::move(state)) {}

  template <class T>
  buffer<T> allocate(std::size_t n) {
    return buffer<T>(state_->dev, n);
  }
  template <class T>
  void fill(std::span<T> dst, T value) {
    ++state_->fills;
    state_->pending = true;
    host_.fill(std::span<T>(static_cast<T*>(dev().real(dst.data(), dst.size_bytes(), "fill")), dst.size()), value);
  }
  // The shape contracts the device kernels rely on (each decodes its index with each view's
  // own extents) are checked here, on every call the layer makes.
  template <class U, class T>
  void copy(const tensor_view<const U, 4>& src, const tensor_view<T, 4>& dst, baton::cp_copy_mode mode = baton::cp_copy_mode::exact) {
    if (src.extents() != dst.extents()) throw std::logic_error("copy: the views' extents differ");
    ++state_->copies;
    state_->pending = true;
    host_.copy(real_view(dev(), src, "copy (source)"), real_view(dev(), dst, "copy (destination)"), mode);
  }
  template <class A, class T>
  void accumulate(const tensor_view<A, 4>& acc, const tensor_view<const T, 4>& src) {
    static_assert(std::is_same_v<A, baton::cp_accumulator_t<A>>, "accumulators are fp32 or wider");
    if (acc.extents() != src.extents()) throw std::logic_error("accumulate: the views' extents differ");
    ++state_->accumulates;
    state_->pending = true;
    host_.accumulate(real_view(dev(), acc, "accumulate"), real_view(dev(), src, "accumulate (source)"));
  }
  template <class A, class T, class L>
  void merge(const tensor_view<A, 4>& out, const tensor_view<A, 4>& lse, const tensor_view<const T, 4>& out_b, const tensor_view<const L, 4>& lse_b) {
    const std::array<std::int64_t, 4> rows{out.extent(0), out.extent(1), out.extent(2), 1};
    if (out_b.extents() != out.extents() || lse.extents() != rows || lse_b.extents() != rows)
      throw std::logic_error("merge: out, out_b must be [b, s, h, d] and lse, lse_b [b, s, h, 1] of the same rows");
    ++state_->merges;
    state_->pending = true;
    host_.merge(real_view(dev(), out, "merge (out)"), real_view(dev(), lse, "merge (lse)"),
                real_view(dev(), out_b, "merge (out_b)"), real_view(dev(), lse_b, "merge (lse_b)"));
  }
  void synchronize() noexcept {
    ++state_->syncs;
    state_->pending = false;
  }
  template <class F>
  void with_host_bytes(std::span<const std::byte> send, std::span<std::byte> recv, F&& f) {
    ++state_->staged;
    buffer<std::byte> s(state_->dev, send.size()), r(state_->dev, recv.size());
    if (!send.empty()) std::memcpy(dev().real(s.data(), send.size(), "stage"), send.data(), send.size());
    state_->pending = false;  // the upload is synchronous
    f(std::span<const std::byte>(s.data(), send.size()), std::span<std::byte>(r.data(), recv.size()));
    if (!recv.empty()) std::memcpy(recv.data(), dev().real(r.data(), recv.size(), "unstage"), recv.size());
  }
  std::string check_tensor(const void* data, const char* name) const {
    if (dev().owns(data)) return {};
    return std::string("tensor '") + name + "' is not fake device memory";
  }

  rank_state& state() const { return *state_; }

 private:
  fake_device& dev() const { return *state_->dev; }
  std::shared_ptr<rank_state> state_;
  baton::host_memory host_;
};

static_assert(baton::cp_memory_space<fake_memory>);
static_assert(baton::cp_memory_space<baton::host_memory>);

// Reference attention on translated views; its "kernels" leave work pending.
struct fake_backend {
  std::shared_ptr<rank_state> state;

  template <class TQ, class TK, class TV, class Mask, class TO, class TL>
  void forward(baton::tensor_view<TQ, 4> q, baton::tensor_view<TK, 4> k, baton::tensor_view<TV, 4> v, const Mask& mask,
               baton::tensor_view<TO, 4> out, baton::tensor_view<TL, 3> lse, const baton::attention_params& params) {
    const fake_device& dev = *state->dev;
    ++state->backend_calls;
    state->pending = true;
    baton::reference_attention{}.forward(real_tensor(dev, q, "backend q"), real_tensor(dev, k, "backend k"),
                                         real_tensor(dev, v, "backend v"), mask, real_tensor(dev, out, "backend out"),
                                         real_tensor(dev, lse, "backend lse"), params);
  }
  template <class TQ, class TK, class TV, class TO, class TL, class TD, class Mask, class TG1, class TG2, class TG3>
  void backward(baton::tensor_view<TQ, 4> q, baton::tensor_view<TK, 4> k, baton::tensor_view<TV, 4> v,
                baton::tensor_view<TO, 4> out, baton::tensor_view<TL, 3> lse, baton::tensor_view<TD, 4> dout,
                const Mask& mask, baton::tensor_view<TG1, 4> dq, baton::tensor_view<TG2, 4> dk,
                baton::tensor_view<TG3, 4> dv, const baton::attention_params& params) {
    const fake_device& dev = *state->dev;
    ++state->backend_calls;
    state->pending = true;
    baton::reference_attention{}.backward(
        real_tensor(dev, q, "backend q"), real_tensor(dev, k, "backend k"), real_tensor(dev, v, "backend v"),
        real_tensor(dev, out, "backend out"), real_tensor(dev, lse, "backend lse"), real_tensor(dev, dout, "backend dout"),
        mask, real_tensor(dev, dq, "backend dq"), real_tensor(dev, dk, "backend dk"), real_tensor(dev, dv, "backend dv"),
        params);
  }
};

// The local world on translated spans; refuses a transfer while work is pending.
class fake_comm {
 public:
  fake_comm(baton::local_communicator& inner, std::shared_ptr<rank_state> state)
      : inner_(&inner), state_(std::move(state)) {}
  int rank() const { return inner_->rank(); }
  int size() const { return inner_->size(); }

  auto shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    ready("shift");
    return inner_->shift(real(send, "shift (send)"), real(recv, "shift (recv)"), k, tag);
  }
  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    ready("all_to_all");
    inner_->all_to_all<T>(real(send, "all_to_all (send)"), real(recv, "all_to_all (recv)"));
  }
  template <class T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> send, std::span<const std::int64_t> send_counts,
                    std::span<T> recv, std::span<const std::int64_t> recv_counts) {
    ready("all_to_all_v");
    inner_->all_to_all_v<T>(real(send, "all_to_all_v (send)"), send_counts, real(recv, "all_to_all_v (recv)"),
                            recv_counts);
  }
  void barrier() { inner_->barrier(); }

 private:
  void ready(const char* what) {
    ++state_->transfers;
    if (state_->pending)
      throw std::logic_error(std::string(what) + ": a buffer was handed to the communicator before synchronize()");
  }
  template <class T>
  std::span<T> real(std::span<T> s, const char* who) const {
    if (s.empty()) return s;
    return {static_cast<T*>(state_->dev->real(s.data(), s.size_bytes(), who)), s.size()};
  }
  baton::local_communicator* inner_;
  std::shared_ptr<rank_state> state_;
};

static_assert(baton::ring_communicator<fake_comm> && baton::all_to_all_communicator<fake_comm>);

// fake_memory with the stream-ordered transfer hooks cuda_device_memory offers over NCCL
// (cp/memory.hpp): order_before(comm) stands for the communicator's streams waiting for an
// event on this "stream", so the work pending so far no longer forbids a transfer (without
// a synchronize); order_after(request) for this stream waiting for the transfer (here the
// host waits: the fake's "kernels" run at once on the host, so they need the data now).
class ordered_fake_memory : public fake_memory {
 public:
  using fake_memory::fake_memory;
  void order_before(fake_comm&) {
    ++state().orders_before;
    state().pending = false;
  }
  template <class Request>
  void order_after(Request& request) {
    ++state().orders_after;
    request.wait();
  }
};
static_assert(baton::cp_memory_space<ordered_fake_memory>);

}  // namespace

// The trait path: a fake_backend's memory space is fake_memory, made from the backend.
template <>
struct baton::cp_memory_space_of<fake_backend> {
  using type = fake_memory;
  static type make(const fake_backend& b) { return fake_memory(b.state); }
};

namespace {

using cp_test::mode;

// One rank on the fake device: upload the shards, run forward and backward, download.
template <class T, class Attention, class Mask>
void run_fake_rank(fake_device& dev, Attention& attn, const baton::sequence_sharding& sharding, int rank,
                   const cp_test::problem<T>& p, const Mask& mask, cp_test::tensors<T>& result) {
  using L = baton::lse_t<T>;
  const cp_test::dims& d = p.d;
  const std::int64_t sl = sharding.local_len(rank);
  const std::vector<std::int64_t> qs{d.batch, d.seq, d.heads_q, d.dim}, kvs{d.batch, d.seq, d.heads_kv, d.dim},
      ls{d.batch, d.heads_q, d.seq};
  const auto q = dev.upload(baton::shard_sequence<T>(sharding, rank, p.q, qs, 1));
  const auto k = dev.upload(baton::shard_sequence<T>(sharding, rank, p.k, kvs, 1));
  const auto v = dev.upload(baton::shard_sequence<T>(sharding, rank, p.v, kvs, 1));
  const auto dout = dev.upload(baton::shard_sequence<T>(sharding, rank, p.dout, qs, 1));
  const auto nq = static_cast<std::size_t>(d.batch * sl * d.heads_q * d.dim);
  const auto nkv = static_cast<std::size_t>(d.batch * sl * d.heads_kv * d.dim);
  const auto nl = static_cast<std::size_t>(d.batch * d.heads_q * sl);
  T* out = static_cast<T*>(dev.allocate(nq * sizeof(T)));
  T* dq = static_cast<T*>(dev.allocate(nq * sizeof(T)));
  T* dk = static_cast<T*>(dev.allocate(nkv * sizeof(T)));
  T* dv = static_cast<T*>(dev.allocate(nkv * sizeof(T)));
  L* lse = static_cast<L*>(dev.allocate(nl * sizeof(L)));
  const auto t4 = [&](auto* ptr, std::int64_t h) { return baton::make_tensor_view(ptr, {d.batch, sl, h, d.dim}); };
  const auto c4 = [&](const T* ptr, std::int64_t h) { return baton::make_tensor_view(ptr, {d.batch, sl, h, d.dim}); };
  attn.forward(c4(q, d.heads_q), c4(k, d.heads_kv), c4(v, d.heads_kv), mask, t4(out, d.heads_q),
               baton::make_tensor_view(lse, {d.batch, d.heads_q, sl}));
  attn.backward(c4(q, d.heads_q), c4(k, d.heads_kv), c4(v, d.heads_kv), c4(out, d.heads_q),
                baton::make_tensor_view(static_cast<const L*>(lse), {d.batch, d.heads_q, sl}), c4(dout, d.heads_q),
                mask, t4(dq, d.heads_q), t4(dk, d.heads_kv), t4(dv, d.heads_kv));
  baton::unshard_sequence<T>(sharding, rank, dev.download(out, nq), qs, 1, result.out);
  baton::unshard_sequence<L>(sharding, rank, dev.download(lse, nl), ls, 2, result.lse);
  baton::unshard_sequence<T>(sharding, rank, dev.download(dq, nq), qs, 1, result.dq);
  baton::unshard_sequence<T>(sharding, rank, dev.download(dk, nkv), kvs, 1, result.dk);
  baton::unshard_sequence<T>(sharding, rank, dev.download(dv, nkv), kvs, 1, result.dv);
  for (const void* ptr : {static_cast<const void*>(q), static_cast<const void*>(k), static_cast<const void*>(v),
                          static_cast<const void*>(dout), static_cast<const void*>(out), static_cast<const void*>(dq),
                          static_cast<const void*>(dk), static_cast<const void*>(dv), static_cast<const void*>(lse)})
    dev.free(const_cast<void*>(ptr));
}

struct fake_run {
  cp_test::tensors<double> result;
  std::vector<rank_state> states;  // per world rank, after the run
};

// Ring and Ulysses get their memory space from the backend (the trait); hybrid an explicit one.
template <class Mask>
fake_run run_fake(const cp_test::config& c, const baton::sequence_sharding& sharding,
                  const cp_test::problem<double>& p, const Mask& mask, fake_device& dev) {
  fake_run run{cp_test::tensors<double>(p.d), std::vector<rank_state>(static_cast<std::size_t>(c.world()))};
  baton::run_local(c.world(), [&](baton::local_communicator& comm) {
    auto state = std::make_shared<rank_state>();
    state->dev = &dev;
    if (c.m == mode::ring) {
      fake_comm ring(comm, state);
      baton::ring_attention attn(ring, fake_backend{state}, sharding);
      static_assert(std::is_same_v<decltype(attn), baton::ring_attention<fake_comm, fake_backend, fake_memory>>);
      run_fake_rank<double>(dev, attn, sharding, attn.shard_index(), p, mask, run.result);
    } else if (c.m == mode::ulysses) {
      fake_comm group(comm, state);
      baton::ulysses_attention attn(group, fake_backend{state}, sharding);
      run_fake_rank<double>(dev, attn, sharding, attn.shard_index(), p, mask, run.result);
    } else {
      auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner_degree);
      fake_comm ulysses(mesh.ulysses, state), ring(mesh.ring, state);
      baton::hybrid_attention attn(ulysses, ring, fake_backend{state}, sharding, fake_memory(state));
      run_fake_rank<double>(dev, attn, sharding, attn.shard_index(), p, mask, run.result);
    }
    run.states[static_cast<std::size_t>(comm.rank())] = *state;
  });
  return run;
}

void require_bitwise(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  REQUIRE(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)) == 0);
}

}  // namespace

TEST_CASE("cp memory: ring, Ulysses and hybrid through a fake device equal the host run bit for bit",
          "[cp][memory]") {
  // Uneven shards (seq 23 over 2 and 3 ranks) and GQA with replicated and per-query kv heads
  // take the general exchanges and the summing unpacks; 24 over 2 the in-place ones.
  struct shape {
    std::int64_t seq, heads_q, heads_kv;
  };
  const std::vector<cp_test::config> configs{
      {mode::ring, baton::shard_layout::zigzag, 3, 1},        {mode::ring, baton::shard_layout::contiguous, 2, 1},
      {mode::ulysses, baton::shard_layout::contiguous, 2, 1}, {mode::ulysses, baton::shard_layout::zigzag, 3, 1},
      {mode::hybrid, baton::shard_layout::zigzag, 2, 2},
  };
  for (const shape sh : {shape{24, 4, 2}, shape{23, 6, 1}, shape{23, 3, 3}}) {
    cp_test::dims d;
    d.batch = 2;
    d.seq = sh.seq;
    d.heads_q = sh.heads_q;
    d.heads_kv = sh.heads_kv;
    d.dim = 4;
    cp_test::for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
      const auto p = cp_test::make_problem<double>(d, mask, 11);
      for (const cp_test::config& c : configs) {
        if (c.m == mode::hybrid && sh.heads_q % 2 != 0) continue;  // keep the 2 x 2 mesh to even heads
        INFO(c.text() << ", mask " << mask_name << ", seq " << sh.seq << ", heads " << sh.heads_q << "/" << sh.heads_kv);
        const baton::sequence_sharding sharding =
            c.m == mode::hybrid ? baton::sequence_sharding(c.layout, d.seq, c.degree, c.inner_degree)
                                : baton::sequence_sharding(c.layout, d.seq, c.degree);
        fake_device dev;
        const fake_run fake = run_fake(c, sharding, p, mask, dev);
        const auto host = cp_test::run_cp_sharded<double>(c, sharding, p, mask);
        require_bitwise(fake.result.out, host.out, "out");
        require_bitwise(fake.result.lse, host.lse, "lse");
        require_bitwise(fake.result.dq, host.dq, "dq");
        require_bitwise(fake.result.dk, host.dk, "dk");
        require_bitwise(fake.result.dv, host.dv, "dv");
        CHECK(cp_test::compare(fake.result, p.reference).max() < cp_test::tolerance<double>());
        CHECK(dev.live() == 0);  // every buffer was given back
        std::int64_t merges = 0, copies = 0;
        for (const rank_state& s : fake.states) {
          CHECK(s.staged > 0);     // the agreement went through the memory space
          CHECK(s.transfers > 0);  // and the data through the fake communicator
          CHECK(s.syncs > 0);
          // Copies go through it too. A ring rank with dense outputs and the longest shard may
          // need none: its own K/V are sent from where they are, every sum lands in the outputs.
          if (c.m != mode::ring) CHECK(s.copies > 0);
          copies += s.copies;
          if (c.m != mode::ulysses && s.backend_calls > 0) CHECK(s.accumulates > 0);  // the ring summed its gradients
          merges += s.merges;
        }
        // The ring merged partial results where a rank's rows met several blocks (a row's
        // first block is written in place, without a merge).
        if (c.m != mode::ulysses) CHECK(merges > 0);
        if (d.seq % c.degree != 0) CHECK(copies > 0);  // a shorter shard is packed to the common length
      }
    });
  }
}

TEST_CASE("cp memory: a ring over stream-ordered transfer hooks makes no synchronisation per step", "[cp][memory]") {
  // The ring's transfers through order_before / order_after (what cuda_device_memory does
  // over NCCL) instead of synchronize() / wait(): the same bits, every transfer still
  // ordered after the work before it (fake_comm refuses one that is not), and a count of
  // synchronisations per call that does not grow with the ring's steps; with plain
  // synchronize() it does (the control).
  cp_test::dims d;
  d.batch = 1;
  d.heads_q = 2;
  d.heads_kv = 1;
  d.dim = 4;
  const baton::no_mask mask;  // every step active
  struct counts {
    int syncs = 0, orders_before = 0, orders_after = 0, transfers = 0;
  };
  const auto run = [&](int ranks, bool ordered) {
    d.seq = 6 * ranks;
    const auto p = cp_test::make_problem<double>(d, mask, 3);
    const baton::sequence_sharding sharding(baton::shard_layout::contiguous, d.seq, ranks);
    fake_device dev;
    cp_test::tensors<double> result(d);
    std::vector<counts> per_rank(static_cast<std::size_t>(ranks));
    baton::run_local(ranks, [&](baton::local_communicator& comm) {
      auto state = std::make_shared<rank_state>();
      state->dev = &dev;
      fake_comm ring(comm, state);
      if (ordered) {
        baton::ring_attention attn(ring, fake_backend{state}, sharding, ordered_fake_memory(state));
        run_fake_rank<double>(dev, attn, sharding, attn.shard_index(), p, mask, result);
      } else {
        baton::ring_attention attn(ring, fake_backend{state}, sharding, fake_memory(state));
        run_fake_rank<double>(dev, attn, sharding, attn.shard_index(), p, mask, result);
      }
      per_rank[static_cast<std::size_t>(comm.rank())] = {state->syncs, state->orders_before, state->orders_after,
                                                         state->transfers};
    });
    const auto host = cp_test::run_cp_sharded<double>({mode::ring, baton::shard_layout::contiguous, ranks, 1}, sharding, p, mask);
    INFO(ranks << " ranks, " << (ordered ? "ordered" : "synchronised"));
    CHECK(cp_test::same_bits(result, host));
    CHECK(dev.live() == 0);
    for (std::size_t r = 1; r < per_rank.size(); ++r) CHECK(per_rank[r].syncs == per_rank[0].syncs);
    return per_rank[0];
  };
  const counts ordered2 = run(2, true), ordered4 = run(4, true), plain2 = run(2, false), plain4 = run(4, false);
  CHECK(ordered4.transfers > ordered2.transfers);  // more steps, more transfers...
  CHECK(ordered4.syncs == ordered2.syncs);         // ...and no more synchronisations
  // The ring's transfers were ordered after the queue (fake_comm refused any that was not;
  // the agreement's own transfers go through with_host_bytes, which stages and waits).
  CHECK(ordered2.orders_before > 0);
  CHECK(ordered4.orders_before > ordered2.orders_before);
  CHECK(ordered4.orders_after > 0);
  CHECK(plain4.syncs > plain2.syncs);  // the control: synchronize() per transfer
  CHECK(plain2.orders_before == 0);
  CHECK(ordered2.syncs < plain2.syncs);
}

TEST_CASE("cp memory: host tensors given to a device memory space fail on every rank together", "[cp][memory]") {
  cp_test::dims d;
  d.seq = 8;
  d.heads_q = 2;
  d.heads_kv = 2;
  d.dim = 4;
  const baton::sequence_sharding sharding(baton::shard_layout::contiguous, d.seq, 2);
  fake_device dev;
  // Per rank: the error's text and whether the backend ran (checked on the main thread:
  // Catch's assertions are not thread-safe).
  std::vector<std::string> messages(2);
  std::vector<int> backend_calls(2, -1);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    auto state = std::make_shared<rank_state>();
    state->dev = &dev;
    fake_comm ring(comm, state);
    baton::ring_attention attn(ring, fake_backend{state}, sharding);
    const std::int64_t sl = sharding.local_len(comm.rank());
    // Rank 0 passes host memory for q; rank 1 passes fake device memory throughout.
    std::vector<double> host_q(static_cast<std::size_t>(d.batch * sl * d.heads_q * d.dim));
    const auto n = host_q.size();
    auto* q = static_cast<double*>(dev.allocate(n * sizeof(double)));
    auto* out = static_cast<double*>(dev.allocate(n * sizeof(double)));
    auto* lse = static_cast<double*>(dev.allocate(static_cast<std::size_t>(d.batch * d.heads_q * sl) * sizeof(double)));
    const double* q_arg = comm.rank() == 0 ? host_q.data() : q;
    const auto c4 = [&](const double* ptr) { return baton::make_tensor_view(ptr, {d.batch, sl, d.heads_q, d.dim}); };
    try {
      attn.forward(c4(q_arg), c4(q), c4(q), baton::no_mask{}, baton::make_tensor_view(out, {d.batch, sl, d.heads_q, d.dim}),
                   baton::make_tensor_view(lse, {d.batch, d.heads_q, sl}));
    } catch (const baton::cp_error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
    backend_calls[static_cast<std::size_t>(comm.rank())] = state->backend_calls;
    dev.free(q);
    dev.free(out);
    dev.free(lse);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK(messages[r].find("tensor 'q' is not fake device memory") != std::string::npos);
    CHECK(messages[r].find("rank 0") != std::string::npos);
    CHECK(backend_calls[r] == 0);  // nothing ran
  }
}

TEST_CASE("cp memory: the memory-space trait and the locations", "[cp][memory]") {
  STATIC_REQUIRE(std::is_same_v<baton::cp_memory_space_t<baton::reference_attention>, baton::host_memory>);
  STATIC_REQUIRE(std::is_same_v<baton::cp_memory_space_t<const fake_backend&>, fake_memory>);
  STATIC_REQUIRE(baton::host_memory::location == baton::cp_memory_location::host);
  // The default memory space of the public classes is the backend's, so host users see no
  // change in their types.
  STATIC_REQUIRE(std::is_same_v<baton::ring_attention<baton::local_communicator, baton::reference_attention>,
                                baton::ring_attention<baton::local_communicator, baton::reference_attention,
                                                      baton::host_memory>>);
  STATIC_REQUIRE(!baton::detail::cp::device_communicator<baton::local_communicator>);
}

TEST_CASE("docs: the memory space from the backend or explicit", "[cp][memory][docs]") {
  cp_test::dims d;
  d.seq = 12;
  const auto p = cp_test::make_problem<double>(d, baton::causal_mask{}, 71);
  const baton::sequence_sharding sharding(baton::shard_layout::zigzag, d.seq, 2);
  cp_test::tensors<double> from_backend(d), from_argument(d);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    // [doc:cp_memory_space]
    // The backend's memory space: host_memory for reference_attention.
    baton::ring_attention ring(comm, baton::reference_attention{}, sharding);
    // Or an explicit one, as the last constructor argument (here the same).
    baton::ring_attention explicit_ring(comm, baton::reference_attention{}, sharding, baton::host_memory{});
    static_assert(std::is_same_v<baton::cp_memory_space_t<baton::reference_attention>, baton::host_memory>);
    // [/doc:cp_memory_space]
    static_assert(std::is_same_v<decltype(ring), decltype(explicit_ring)>);
    cp_test::run_rank<double>(ring, sharding, comm.rank(), p, baton::causal_mask{}, from_backend, 0);
    cp_test::run_rank<double>(explicit_ring, sharding, comm.rank(), p, baton::causal_mask{}, from_argument, 0);
  });
  CHECK(cp_test::compare(from_backend, p.reference).max() < cp_test::tolerance<double>());
  require_bitwise(from_argument.out, from_backend.out, "out");
  require_bitwise(from_argument.dk, from_backend.dk, "dk");
}
