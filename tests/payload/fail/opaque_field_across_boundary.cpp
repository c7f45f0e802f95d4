// A record with an opaque field is declared as what crosses a stage boundary (seed 000's
// BlockMask forwarded through the pipe): the error names the field and says to use a side input.
// build error: opaque_field_at_stage_boundary<baton::field<baton::fixed_string<10>\{"attn_mask"\}, block_mask>.*opaque values cannot cross a stage boundary. pass them as a side input
#include <baton/payload.hpp>

struct block_mask {
  int kv_blocks = 0;
};
template <>
struct baton::payload_traits<block_mask> {
  static constexpr payload_role role = payload_role::opaque;
};

using stage_output = baton::record<baton::field<"hidden", baton::host_tensor<float>>, baton::field<"attn_mask", block_mask>>;
static_assert(baton::require_sendable<stage_output>());

int main() {}
