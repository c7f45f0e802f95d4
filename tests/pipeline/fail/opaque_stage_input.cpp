// Must not compile: seed 000's situation written the wrong way round — a block mask (opaque)
// declared as a field of a stage's input, i.e. sent through the pipe. The executor refuses it
// and says to pass the mask as a side input.
// build error: baton: this payload holds an opaque field: opaque values cannot cross a stage boundary. pass them as a side input .the stage's `side` type. instead of a field of its input or output
#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

struct block_mask {
  int kv_blocks = 0;
};
template <>
struct baton::payload_traits<block_mask> {
  static constexpr payload_role role = payload_role::opaque;
};

using hidden = baton::host_tensor<double>;
using masked = baton::record<baton::field<"hidden", hidden>, baton::field<"mask", block_mask>>;

struct masked_stage {
  using input = masked;
  using output = masked;
  using side = baton::no_side;
  struct saved {};
  output forward(const input& x, const side&, saved&) { return x; }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) { return dy; }
};

struct loss {
  baton::loss_result<baton::grad_t<masked>> operator()(const masked& y, const hidden&) const {
    return {0.0, baton::grad_like(y)};
  }
};

void build(baton::local_communicator& comm) {
  auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<masked_stage>>(
      comm, baton::schedule_shape{2, 1, 2}, [](int) { return masked_stage{}; }, loss{});
}
